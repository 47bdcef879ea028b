"""Q6_K: super-blocks of 256 weights in 210 bytes: 128 bytes ql (low 4 bits), 64 bytes qh (high
2 bits), 16 int8 scales (one per 16 weights), f16 d; w = d * sc * (q - 32), q 0..63. In half j
(weights 128j..128j+127), for i < 32: weight 128j+i = ql[64j+i] low nibble | qh[32j+i] bits 0-1,
+32: ql[64j+32+i] low | bits 2-3, +64: ql[64j+i] high | bits 4-5, +96: ql[64j+32+i] high | bits 6-7.

Packed layout (a group of 8 rows, per super-block, 1680 bytes; kernels/quants/kquants.py):
d[8] f16 | the 16 scale bytes transposed (128 B) | per lane l (0..7) and half j, 3 chunks of
32 B: row r's ql[64j+4l..+3], ql[64j+32+4l..+3], qh[32j+4l..+3] at 4r. Activations: Q8_K.
llama.cpp (x86, prompts and decode alike: ggml_vec_dot_q6_K_q8_K, AVX2) keeps 8 lanes per
row; lane l holds, per super-block, the exact integer
    S_l = sum over the 8 vectors v of 32 weights of sc[2v + (l >= 4)] * (q . x over weights
          32v+4l..32v+4l+3)  -  32 * (sc[2l] * bsum[2l] + sc[2l+1] * bsum[2l+1])
and a_l = fma(d * d_x, float(S_l), a_l), the result ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)).
That is for fewer than 8 tokens; with 8 or more llama.cpp runs its tiled K-quant matmul
(ggml-cpu/tiled, AVX-512 VNNI microkernel), which per super-block takes the exact integer
S = sum of the S_l and accumulates acc = fma(float(S) * d, d_x, acc) (the product rounded).
The kernels here hold those lanes for 8 rows (one F32x8 per lane) and pick each token's order
by the size of the llama.cpp call it belongs to (scratch.call_length, kernels/quants/common.py;
>= 8: tiled), so they are bit-equal to it whatever else shares the kernel call. Decode steps of
4+ sessions run 4 of their tokens together, each lane's 6-bit values unpacked once for all four
(each token still summed as if alone), with AVX512-VNNI on a pair of row groups (16 rows,
row_pairs.py). In the vec_dot order each 4-weight dot is one vpdpbusd, two dots share a lane as
int16 halves for one pmaddwd by their two scales, and the -32 offset is one pmaddwd: fewer
multiply-unit ops than pmaddubsw + pmaddwd per vector, the same integers S_l.
"""
import numpy as np
from numba import njit

from ..simd import (add, align_stack_frame, fma, load_halves_as_f32, mul, splat_f32, splat_i32, store_f32x8,
                    to_f32, zeros_f32x8, zeros_i32x8)
from ..simd_int import (bits_or, broadcast_i32, broadcast_i8x4, dot4_acc, dot_halves_acc, dot_halves_i16, high_nibbles,
                        join_halves, low_nibbles, mask_bits, mul_i32, shift_left, shift_right, sub_int,
                        wide_dot4_available)
from .common import MATMUL_SIGNATURE, ROWS_PER_GROUP, dequantize_halves, locate, run_parallel, run_serial
from .kquants import (SCRATCH_SLOTS, held, hold, in_tiled_call, prepare_q8_k, put_chunk, put_halves,  # noqa: F401
                      put_transposed, repack_k)
from .lanes import lane_sum, prefetch_streamed_lines, scale_at, vector_lane_sum
from .row_pairs import (like_rows, load_like_rows, prefetch_tile_rows, rows_chunk, rows_halves, rows_i8x8_as_i32,
                        store_like_rows, store_rows)

FUSABLE = True           # several matrices concatenated, one output per part
TYPE_SIZE = 210
GROUP_BLOCK_BYTES = 1680
_SCALES, _LANES = 16, 144      # offsets in a packed super-block


def dequantize(blocks: np.ndarray) -> np.ndarray:
    """NumPy reference: GGUF blocks (n, 210) u8 -> (n, 256) f32."""
    ql = blocks[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    q = ((ql & 0x0F).reshape(-1, 8, 32) | ((qh & 0x03).reshape(-1, 8, 32) << 4)).astype(np.float32) - 32
    scale = dequantize_halves(blocks, 208) * blocks[:, 192:208].view(np.int8).astype(np.float32)
    return (scale[:, :, None] * q.reshape(-1, 16, 16)).reshape(-1, 256)


@njit(cache=True)
def _pack_groups(raw, packed):
    for g in range(packed.shape[0]):
        for r in range(ROWS_PER_GROUP):
            source = raw[g * ROWS_PER_GROUP + r]
            for b in range(raw.shape[1] // TYPE_SIZE):
                src, dst = b * TYPE_SIZE, b * GROUP_BLOCK_BYTES
                put_halves(source, src + 208, packed[g], dst, r)
                put_transposed(source, src + 192, 16, packed[g], dst + _SCALES, r)
                for lane in range(8):
                    for j in range(2):
                        at = dst + _LANES + 96 * (2 * lane + j)
                        put_chunk(source, src + 64 * j + 4 * lane, packed[g], at, r)
                        put_chunk(source, src + 64 * j + 32 + 4 * lane, packed[g], at + 32, r)
                        put_chunk(source, src + 128 + 32 * j + 4 * lane, packed[g], at + 64, r)


def pack(raw: np.ndarray) -> tuple:
    """GGUF rows (rows, nb*210) -> (packed groups, tail rows); see the layout above."""
    return repack_k(raw, _pack_groups)


TILED_MIN_TOKENS = 8            # llama.cpp's tiled matmul takes calls with at least this many tokens


@njit(cache=True, inline="always")
def _lane(w, base, x, sum_pairs, b, lane, f0, f1, f2, f3):
    """S_lane (I32x8) of super-block b for 8 rows; f0..f3: _scale_halves of the lane's side."""
    first, second = _lane_bits(w, base, lane)
    return _lane_sum(w, first, second, _scale_pair(w, base, lane), x, sum_pairs, b, lane, f0, f1, f2, f3)


@njit(cache=True, inline="always")
def _lane_bits(rows, base, lane):
    """The 6-bit values of a lane's two halves for 8 rows, or 16 for a pair of groups (_six_bits each)."""
    at = base + _LANES + 192 * lane
    return _six_bits(rows, at), _six_bits(rows, at + 96)


@njit(cache=True, inline="always")
def _lane_sum(rows, first, second, scale_pair, x, sum_pairs, b, lane, f0, f1, f2, f3):
    """S_lane (I32x8; I32x16 for a pair of groups, row_pairs) for one token from the lane's unpacked
    halves (first, second: _six_bits):
    each vector's 4-weight dot by vpdpbusd (|dot| <= 4 * 63 * 128, an int16), two vectors' dots
    as the int16 halves of one lane times their two scales (f0..f3: _scale_halves of the side),
    and the offset -32 * (sc[2l] * bsum[2l] + sc[2l+1] * bsum[2l+1]) one pmaddwd of the lane's
    scale pair (_scale_pair) and the token's sum pair (_negated_sum_pairs)."""
    x_at = b * 256 + 4 * lane
    first_half = dot_halves_acc(dot_halves_i16(_paired_dots(rows, first[0], first[1], x, x_at), f0),
                                _paired_dots(rows, first[2], first[3], x, x_at + 64), f1)
    second_half = dot_halves_acc(dot_halves_i16(scale_pair, like_rows(broadcast_i32(sum_pairs, 8 * b + lane), rows)),
                                 _paired_dots(rows, second[0], second[1], x, x_at + 128), f2)
    return add(first_half, dot_halves_acc(second_half, _paired_dots(rows, second[2], second[3], x, x_at + 192), f3))


@njit(cache=True, inline="always")
def _paired_dots(rows, v, w, x, x_at):
    """v . x[x_at..] and w . x[x_at+32..] per row (vpdpbusd twice) as the low and high int16 of an
    I32x8 (I32x16 for a pair of groups)."""
    zero = like_rows(zeros_i32x8(), rows)
    low = dot4_acc(zero, v, like_rows(broadcast_i8x4(x, x_at), rows))
    high = dot4_acc(zero, w, like_rows(broadcast_i8x4(x, x_at + 32), rows))
    return join_halves(low, high)


@njit(cache=True, inline="always")
def _scale_halves(rows, base, m, n):
    """sc[m] and sc[n] of 8 rows (16 for a pair of groups) as the low and high int16 of each lane."""
    return join_halves(rows_i8x8_as_i32(rows, base + _SCALES + 8 * m), rows_i8x8_as_i32(rows, base + _SCALES + 8 * n))


@njit(cache=True, inline="always")
def _side_scales(rows, base, side):
    """The f0..f3 (_scale_halves) of one side's lanes: side 0 (lanes 0-3) takes the even scales, 1 the odd."""
    return (_scale_halves(rows, base, side, 2 + side), _scale_halves(rows, base, 4 + side, 6 + side),
            _scale_halves(rows, base, 8 + side, 10 + side), _scale_halves(rows, base, 12 + side, 14 + side))


@njit(cache=True, inline="always")
def _side_lanes(w, base, x, sum_pairs, b, side, dd, a0, a1, a2, a3):
    """One token's accumulators of a side's 4 lanes (4 * side on) after super-block b."""
    f0, f1, f2, f3 = _side_scales(w, base, side)
    lane = 4 * side
    return (fma(dd, to_f32(_lane(w, base, x, sum_pairs, b, lane, f0, f1, f2, f3)), a0),
            fma(dd, to_f32(_lane(w, base, x, sum_pairs, b, lane + 1, f0, f1, f2, f3)), a1),
            fma(dd, to_f32(_lane(w, base, x, sum_pairs, b, lane + 2, f0, f1, f2, f3)), a2),
            fma(dd, to_f32(_lane(w, base, x, sum_pairs, b, lane + 3, f0, f1, f2, f3)), a3))


@njit(cache=True, inline="always")
def _scale_pair(rows, base, lane):
    """32 * sc[2 lane] and 32 * sc[2 lane + 1] of 8 rows (16 for a pair of groups) as the low and
    high int16 of each lane (|32 * sc| <= 4096)."""
    at = base + _SCALES + 16 * lane
    return join_halves(shift_left(rows_i8x8_as_i32(rows, at), 5), shift_left(rows_i8x8_as_i32(rows, at + 8), 5))


@njit(cache=True)
def _negated_sum_pairs(bsums, call_length, pairs):
    """Q8_K block sums (T, K/16) -> pairs (T, K/32) int32: -bsum[2m] and -bsum[2m+1] as its low and
    high int16 (|bsum| <= 16 * 128), for the tokens the vec_dot order takes (the others' rows unset)."""
    for t in range(pairs.shape[0]):
        if in_tiled_call(call_length, t, TILED_MIN_TOKENS):
            continue
        for m in range(pairs.shape[1]):
            low, high = -bsums[t, 2 * m], -bsums[t, 2 * m + 1]
            pairs[t, m] = np.int32((low & 0xFFFF) | (high << 16))


@njit(cache=True)
def _group_one(w, xq, xd, sum_pairs, out, t, col):
    """8 rows (packed Q6_K group w) x token t -> out[t, col:col+8]; sum_pairs: _negated_sum_pairs."""
    align_stack_frame()
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zeros_f32x8()
    x, sums = xq[t], sum_pairs[t]
    for b in range(xd.shape[1]):
        base = b * GROUP_BLOCK_BYTES
        prefetch_streamed_lines(w, base, 27)
        dd = mul(load_halves_as_f32(w, base), splat_f32(xd[t, b]))
        a0, a1, a2, a3 = _side_lanes(w, base, x, sums, b, 0, dd, a0, a1, a2, a3)
        a4, a5, a6, a7 = _side_lanes(w, base, x, sums, b, 1, dd, a4, a5, a6, a7)
    store_f32x8(out[t], col, vector_lane_sum(a0, a1, a2, a3, a4, a5, a6, a7))


LANE_SLOT = 16       # floats per (token, lane) accumulator in _group_one4's scratch: room for a pair of groups
FOUR_LANES_FLOATS = 4 * 8 * LANE_SLOT


@njit(cache=True, inline="always")
def _into_lane(lanes, at, dd, s, rows):
    """lanes[at:] = fma(dd, float(s), lanes[at:]): one token's lane accumulator in memory (8 floats, 16 for a pair)."""
    store_like_rows(lanes, at, fma(dd, to_f32(s), load_like_rows(lanes, at, rows)), rows)


@njit(cache=True, inline="always")
def _lanes_total(lanes, at, rows):
    """vector_lane_sum of one token's 8 lane accumulators from lanes[at] on (LANE_SLOT apart)."""
    k = LANE_SLOT
    return vector_lane_sum(load_like_rows(lanes, at, rows), load_like_rows(lanes, at + k, rows),
                           load_like_rows(lanes, at + 2 * k, rows), load_like_rows(lanes, at + 3 * k, rows),
                           load_like_rows(lanes, at + 4 * k, rows), load_like_rows(lanes, at + 5 * k, rows),
                           load_like_rows(lanes, at + 6 * k, rows), load_like_rows(lanes, at + 7 * k, rows))


@njit(cache=True, inline="always")      # common.py, run_serial
def _group_one4(rows, xq, xd, sum_pairs, dest, t0, t1, t2, t3, lanes):
    """_group_one for 4 tokens (distinct) x a packed group or a pair of them (row_pairs) -> dest, each
    in its own lane order as if alone, each lane's 6-bit values unpacked once for all four (decode
    steps of 4+ sessions); lanes: FOUR_LANES_FLOATS of float32 scratch (the 32 lane accumulators do
    not fit in registers)."""
    lanes[:] = 0.0
    x0, x1, x2, x3 = xq[t0], xq[t1], xq[t2], xq[t3]
    u0, u1, u2, u3 = sum_pairs[t0], sum_pairs[t1], sum_pairs[t2], sum_pairs[t3]
    token = 8 * LANE_SLOT
    for b in range(xd.shape[1]):
        base = b * GROUP_BLOCK_BYTES
        prefetch_tile_rows(rows, base, 27)
        d = rows_halves(rows, base)
        d0, d1 = mul(d, like_rows(splat_f32(xd[t0, b]), rows)), mul(d, like_rows(splat_f32(xd[t1, b]), rows))
        d2, d3 = mul(d, like_rows(splat_f32(xd[t2, b]), rows)), mul(d, like_rows(splat_f32(xd[t3, b]), rows))
        for side in range(2):
            f0, f1, f2, f3 = _side_scales(rows, base, side)
            for lane in range(4 * side, 4 * side + 4):
                first, second = _lane_bits(rows, base, lane)
                pair = _scale_pair(rows, base, lane)
                at = LANE_SLOT * lane
                _into_lane(lanes, at, d0, _lane_sum(rows, first, second, pair, x0, u0, b, lane, f0, f1, f2, f3), rows)
                _into_lane(lanes, token + at, d1,
                           _lane_sum(rows, first, second, pair, x1, u1, b, lane, f0, f1, f2, f3), rows)
                _into_lane(lanes, 2 * token + at, d2,
                           _lane_sum(rows, first, second, pair, x2, u2, b, lane, f0, f1, f2, f3), rows)
                _into_lane(lanes, 3 * token + at, d3,
                           _lane_sum(rows, first, second, pair, x3, u3, b, lane, f0, f1, f2, f3), rows)
    store_rows(dest, t0, _lanes_total(lanes, 0, rows))
    store_rows(dest, t1, _lanes_total(lanes, token, rows))
    store_rows(dest, t2, _lanes_total(lanes, 2 * token, rows))
    store_rows(dest, t3, _lanes_total(lanes, 3 * token, rows))


@njit(cache=True, inline="always")
def _six_bits(rows, at):
    """The 6-bit values (0..63) of one lane of one half, chunks at byte `at` of each group: its
    4 vectors' 4 weights for 8 rows (I8x32 each; I8x64 for a pair of groups, row_pairs)."""
    low, high, bits = rows_chunk(rows, at), rows_chunk(rows, at + 32), rows_chunk(rows, at + 64)
    return (bits_or(low_nibbles(low), shift_left(mask_bits(bits, 3), 4)),
            bits_or(low_nibbles(high), shift_left(mask_bits(bits, 12), 2)),
            bits_or(high_nibbles(low), mask_bits(bits, 48)),
            bits_or(high_nibbles(high), shift_right(mask_bits(bits, 192), 2)))


@njit(cache=True, inline="always")
def _dot4_tokens(rows, acc, v, x0, x1, x2, x3, x_at):
    """acc (4 tokens' I32 vectors) + v . each token's 4 activations at x_at (vpdpbusd)."""
    return (dot4_acc(acc[0], v, like_rows(broadcast_i8x4(x0, x_at), rows)),
            dot4_acc(acc[1], v, like_rows(broadcast_i8x4(x1, x_at), rows)),
            dot4_acc(acc[2], v, like_rows(broadcast_i8x4(x2, x_at), rows)),
            dot4_acc(acc[3], v, like_rows(broadcast_i8x4(x3, x_at), rows)))


@njit(cache=True, inline="always")
def _add_scaled(s, acc, scale):
    """s + acc * scale for 4 tokens (exact: |acc| <= 16 * 63 * 128, |scale| <= 128)."""
    return (add(s[0], mul_i32(acc[0], scale)), add(s[1], mul_i32(acc[1], scale)),
            add(s[2], mul_i32(acc[2], scale)), add(s[3], mul_i32(acc[3], scale)))


@njit(cache=True, inline="always")
def _scaled_quarter(rows, base, half, side, s, x0, x1, x2, x3, x_at):
    """s (4 tokens) + the 4 vectors of `half` over lanes 4*side..4*side+3, each vector's dots
    times its scale sc[2 * (4 * half + k) + side] (those 16 weights share it)."""
    zero = like_rows(zeros_i32x8(), rows)
    a0 = a1 = a2 = a3 = (zero, zero, zero, zero)       # per vector k, 4 tokens
    for lane in range(4 * side, 4 * side + 4):
        v0, v1, v2, v3 = _six_bits(rows, base + _LANES + 192 * lane + 96 * half)
        at = x_at + 4 * lane
        a0 = _dot4_tokens(rows, a0, v0, x0, x1, x2, x3, at)
        a1 = _dot4_tokens(rows, a1, v1, x0, x1, x2, x3, at + 32)
        a2 = _dot4_tokens(rows, a2, v2, x0, x1, x2, x3, at + 64)
        a3 = _dot4_tokens(rows, a3, v3, x0, x1, x2, x3, at + 96)
    scales = base + _SCALES + 8 * (8 * half + side)         # scale index 2 * (4 * half + k) + side
    s = _add_scaled(s, a0, rows_i8x8_as_i32(rows, scales))
    s = _add_scaled(s, a1, rows_i8x8_as_i32(rows, scales + 16))
    s = _add_scaled(s, a2, rows_i8x8_as_i32(rows, scales + 32))
    return _add_scaled(s, a3, rows_i8x8_as_i32(rows, scales + 48))


@njit(cache=True, inline="always")
def _offset(rows, base, sums, b, m):
    """32 * (sc[m] * bsum[m] + sc[m+1] * bsum[m+1]) for 8 rows (I32x8; I32x16 for a pair)."""
    at = base + _SCALES + 8 * m
    return shift_left(add(mul_i32(rows_i8x8_as_i32(rows, at), like_rows(splat_i32(sums[b * 16 + m]), rows)),
                          mul_i32(rows_i8x8_as_i32(rows, at + 8), like_rows(splat_i32(sums[b * 16 + m + 1]), rows))), 5)


@njit(cache=True, inline="always")
def _offsets(rows, base, sums, b):
    """32 * sum over the 16 scales m of sc[m] * bsum[m]: the -32 of every weight, for one token."""
    total = _offset(rows, base, sums, b, 0)
    for m in range(2, 16, 2):
        total = add(total, _offset(rows, base, sums, b, m))
    return total


@njit(cache=True)
def _group_tiled4(rows, xq, xd, bsums, dest, t0, t1, t2, t3):
    """A packed Q6_K group, or a pair of them (row_pairs), x tokens t0, t1, t2, t3 of calls with >= 8
    tokens -> dest, the tiled matmul's order: per super-block the exact integer S (any order
    gives it) as 16-weight dots by vpdpbusd, summed 4 lanes at a time before their scale."""
    align_stack_frame()
    a0 = a1 = a2 = a3 = like_rows(zeros_f32x8(), rows)
    x0, x1, x2, x3 = xq[t0], xq[t1], xq[t2], xq[t3]
    for b in range(xd.shape[1]):
        base = b * GROUP_BLOCK_BYTES
        s = (sub_int(like_rows(zeros_i32x8(), rows), _offsets(rows, base, bsums[t0], b)),
             sub_int(like_rows(zeros_i32x8(), rows), _offsets(rows, base, bsums[t1], b)),
             sub_int(like_rows(zeros_i32x8(), rows), _offsets(rows, base, bsums[t2], b)),
             sub_int(like_rows(zeros_i32x8(), rows), _offsets(rows, base, bsums[t3], b)))
        for half in range(2):
            for side in range(2):
                s = _scaled_quarter(rows, base, half, side, s, x0, x1, x2, x3, b * 256 + 128 * half)
        d = rows_halves(rows, base)
        a0 = fma(mul(to_f32(s[0]), d), like_rows(splat_f32(xd[t0, b]), rows), a0)
        a1 = fma(mul(to_f32(s[1]), d), like_rows(splat_f32(xd[t1, b]), rows), a1)
        a2 = fma(mul(to_f32(s[2]), d), like_rows(splat_f32(xd[t2, b]), rows), a2)
        a3 = fma(mul(to_f32(s[3]), d), like_rows(splat_f32(xd[t3, b]), rows), a3)
    store_rows(dest, t0, a0)
    store_rows(dest, t1, a1)
    store_rows(dest, t2, a2)
    store_rows(dest, t3, a3)


@njit(cache=True, inline="always")
def _tiled_tokens(rows, xq, xd, bsums, dest, call_length):
    """Every token of a call with >= 8 tokens x a group or a pair of groups (row_pairs) -> dest,
    4 tokens at a time."""
    p0 = p1 = p2 = pending = 0                      # tokens waiting for a group of 4
    for t in range(xd.shape[0]):
        if not in_tiled_call(call_length, t, TILED_MIN_TOKENS):
            continue
        if pending == 3:
            _group_tiled4(rows, xq, xd, bsums, dest, p0, p1, p2, t)
            pending = 0
        else:
            pending, p0, p1, p2 = hold(pending, p0, p1, p2, t)
    if pending > 0:                                 # a short last tile repeats its last token
        _group_tiled4(rows, xq, xd, bsums, dest, p0, held(min(1, pending - 1), p0, p1, p2),
                      held(pending - 1, p0, p1, p2), held(pending - 1, p0, p1, p2))


@njit(cache=True, inline="always")
def _vec_dot_tiles(rows, xq, xd, sum_pairs, dest, call_length, lanes):
    """The tokens of calls with fewer than 8 tokens x a group or a pair of groups (row_pairs) -> dest,
    4 at a time -> (count, t0, t1, t2): the fewer than 4 left over (_vec_dot_alone); sum_pairs:
    _negated_sum_pairs; lanes: _group_one4's scratch."""
    g0 = g1 = g2 = pending = 0                      # tokens waiting for 3 more
    for t in range(xd.shape[0]):
        if in_tiled_call(call_length, t, TILED_MIN_TOKENS):
            continue
        if pending == 3:
            _group_one4(rows, xq, xd, sum_pairs, dest, g0, g1, g2, t, lanes)
            pending = 0
        else:
            pending, g0, g1, g2 = hold(pending, g0, g1, g2, t)
    return pending, g0, g1, g2


@njit(cache=True, inline="always")
def _vec_dot_alone(w, xq, xd, sum_pairs, out, col, pending, g0, g1, g2):
    """The tokens _vec_dot_tiles left over x the packed group w -> out[t, col:col+8], one at a time."""
    for k in range(pending):
        _group_one(w, xq, xd, sum_pairs, out, held(k, g0, g1, g2), col)


@njit(cache=True, inline="always")
def _any_tiled_token(call_length):
    """Some token of this kernel call belongs to a call of >= 8 tokens (a prompt step)."""
    for t in range(call_length.shape[0]):
        if in_tiled_call(call_length, t, TILED_MIN_TOKENS):
            return True
    return False


@njit(cache=True)
def _groups(first, last, packed, acts, outs, part_ends):
    """Row groups first..last-1 of packed x the activations -> their columns of outs (every token).
    Where the CPU has AVX512-VNNI and BW (wide_dot4_available) the 4-token tiles (tiled and vec_dot
    orders) take two groups at once."""
    align_stack_frame()
    xq, xd, bsums, _, call_length = acts
    pairs = wide_dot4_available()
    tiled = _any_tiled_token(call_length)
    lanes = np.empty(FOUR_LANES_FLOATS, np.float32)
    sum_pairs = np.empty((bsums.shape[0], bsums.shape[1] // 2), np.int32)
    _negated_sum_pairs(bsums, call_length, sum_pairs)
    i = first
    while i < last:                                 # groups in memory order (a decode step streams them)
        part, col = locate(part_ends, i)
        if pairs and i + 1 < last:
            part1, col1 = locate(part_ends, i + 1)
            rows, dest = (packed[i], packed[i + 1]), (outs[part], col, outs[part1], col1)
            if tiled:
                _tiled_tokens(rows, xq, xd, bsums, dest, call_length)
            pending, g0, g1, g2 = _vec_dot_tiles(rows, xq, xd, sum_pairs, dest, call_length, lanes)
            _vec_dot_alone(packed[i], xq, xd, sum_pairs, outs[part], col, pending, g0, g1, g2)
            _vec_dot_alone(packed[i + 1], xq, xd, sum_pairs, outs[part1], col1, pending, g0, g1, g2)
            i += 2
        else:
            dest = (outs[part], col)
            if tiled:
                _tiled_tokens(packed[i], xq, xd, bsums, dest, call_length)
            pending, g0, g1, g2 = _vec_dot_tiles(packed[i], xq, xd, sum_pairs, dest, call_length, lanes)
            _vec_dot_alone(packed[i], xq, xd, sum_pairs, outs[part], col, pending, g0, g1, g2)
            i += 1


@njit(cache=True)
def _tail(tail, acts, outs, part_ends):
    """The rows after the last full group (GGUF layout) x every token -> the last columns of the last out."""
    xq, xd, bsums, _, call_length = acts
    out = outs[part_ends.shape[0] - 1]
    first = out.shape[1] - tail.shape[0]
    for r in range(tail.shape[0]):
        for t in range(xd.shape[0]):
            out[t, first + r] = row_dot(tail[r], xq[t], xd[t], bsums[t], in_tiled_call(call_length, t, TILED_MIN_TOKENS))


@njit(cache=True, inline="always")
def _q6(row, base, i):
    """The 6-bit value (0..63) of weight i (0..255) of the GGUF super-block at row[base]."""
    j, k, e = i // 128, (i % 128) // 32, i % 32
    low = (np.int32(row[base + 64 * j + 32 * (k % 2) + e]) >> (4 * (k // 2))) & 15
    return low | (((np.int32(row[base + 128 + 32 * j + e]) >> (2 * k)) & 3) << 4)


@njit(cache=True)
def row_dot(row, xq, xd, bsums, tiled):
    """One Q6_K row (nb*210 B) . one token's Q8_K activations -> float32 (llama.cpp's vec_dot
    order, or with `tiled` its tiled matmul's)."""
    lanes = np.zeros(8, np.float32)
    acc = np.float32(0.0)
    signed = row.view(np.int8)
    for b in range(xd.shape[0]):
        base = b * TYPE_SIZE
        dd = xd[b] * scale_at(row, base + 208)
        total = np.int32(0)
        for lane in range(8):
            s = np.int32(0)
            for v in range(8):
                isum = np.int32(0)
                for e in range(4):
                    i = 32 * v + 4 * lane + e
                    isum += _q6(row, base, i) * np.int32(xq[b * 256 + i])
                s += np.int32(signed[base + 192 + 2 * v + lane // 4]) * isum
            m = 2 * lane
            s -= 32 * (np.int32(signed[base + 192 + m]) * bsums[b * 16 + m]
                       + np.int32(signed[base + 193 + m]) * bsums[b * 16 + m + 1])
            lanes[lane] = fma(dd, np.float32(s), lanes[lane])
            total += s
        acc = fma(np.float32(total) * scale_at(row, base + 208), xd[b], acc)
    if tiled:
        return acc
    return lane_sum(lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5], lanes[6], lanes[7])


@njit(cache=True, nogil=True)
def embed_rows(raw, rows, out):
    """Dequantize rows (T,) of a GGUF-layout Q6_K matrix (vocab, nb*210) -> out (T, n) f32 (llama.cpp's
    dequantize_row_q6_K: (d * sc) * (q - 32))."""
    for t in range(rows.shape[0]):
        source = raw[rows[t]]
        signed = source.view(np.int8)
        for b in range(out.shape[1] // 256):
            base = b * TYPE_SIZE
            d = scale_at(source, base + 208)
            for i in range(256):
                out[t, b * 256 + i] = d * np.float32(signed[base + 192 + i // 16]) * np.float32(_q6(source, base, i) - 32)


# ------------------------------------------------------------------ the two entry points

@njit(MATMUL_SIGNATURE, cache=True, nogil=True)
def matmul_serial(packed, tail, part_ends, x, scratch, outs):
    """W Q6_K packed + tail @ x (T, K) -> outs (kernels/quants/common.py), on this thread."""
    run_serial(prepare_q8_k, _groups, _tail, packed, tail, part_ends, x, scratch, outs)


@njit(MATMUL_SIGNATURE, cache=True, parallel=True)
def matmul_parallel(packed, tail, part_ends, x, scratch, outs):
    """The same on numba's thread pool when big enough."""
    run_parallel(prepare_q8_k, _groups, _tail, packed, tail, part_ends, x, scratch, outs)
