"""Q4_K: super-blocks of 256 weights in 144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales and
mins for 8 sub-blocks of 32, 128 nibble bytes (byte 32j+i: weight 64j+i low, 64j+32+i high);
w = d * sc_s * q - dmin * m_s.

Packed layout (a group of 8 rows, per super-block, 1152 bytes; kernels/quants/kquants.py):
d[8] f16 | dmin[8] f16 | the 12 scale bytes transposed (96 B) | 32 chunks (j, c) of 32 B, row r's
nibble bytes 32j+4c..32j+4c+3 at 4r. Activations: Q8_K.
llama.cpp's x86 build repacks Q4_K matrices (rows % 8 == 0) and runs ggml_gemv_q4_K_8x8_q8_K for
single rows of activations and ggml_gemm_q4_K_8x8_q8_K for each 4 rows (a call's first
T - T % 4 tokens; the rest go through the gemv). Both sum, per weight row, exact integers
    S = sum over sub-blocks s of sc_s * (q . x)_s,   M = sum over s of m_s * bsum32_s
into acc = fma(float(S), d * d_x, acc), accm = fma(float(M), dmin * d_x, accm) and return
acc - accm; the gemv does it once per super-block, the gemm once per pair of sub-blocks
(4 per super-block). The kernels here pick each token's order by the same rule applied to
the llama.cpp call it belongs to (scratch.call_index / call_length, kernels/quants/common.py),
so both are bit-equal to llama.cpp's whatever else shares the kernel call; the gemm tokens are
run 4 at a time (a token's result does not depend on its tile partners; a short last tile
repeats one). Tail rows (in GGUF layout) follow the same rule (llama.cpp
itself would not repack a matrix with rows % 8 != 0: its vec_dot order then, not emulated).
The sub-block dots are vpdpbusd where the CPU has VNNI (high nibbles as q & 0xF0, i.e. 16x,
undone after the scale multiply: exact), 16 lanes wide for one decode token (two chunks a vector,
_sub_pair_wide) where it has AVX512-VNNI; a gemm tile of 4 tokens unpacks each chunk once, and so
do 4 tokens in the gemv's order (a decode step of 4+ sessions), each still summed as if alone; with
AVX512-VNNI both tiles take a pair of row groups (16 rows, row_pairs.py) at once.
"""
import numpy as np
from numba import njit

from ..simd import (add, align_stack_frame, concat, fma, high_half, load_halves_as_f32, low_half, mul, splat_f32,
                    splat_i32, store_f32x8, to_f32, zeros_f32x8, zeros_i32x8)
from ..simd_int import (bits_or, broadcast_i8x4, dot4_acc, dot4_high_nibbles_acc, dot_halves_i16, load_i8x32,
                        load_i8x64, low_nibbles, mul_i32, shift_left, shift_right_signed, spread_word_pair,
                        wide_dot4_available)
from ..vec8 import sub
from .common import MATMUL_SIGNATURE, ROWS_PER_GROUP, dequantize_halves, locate, run_parallel, run_serial
from .kquants import (SCRATCH_SLOTS, held, hold, in_gemm_tile, pair_sum, prepare_q8_k, put_chunk, put_halves,  # noqa: F401
                      put_transposed, repack_k, scale_min, scale_min_rows, scales_and_mins)
from .lanes import prefetch_streamed_lines, scale_at
from .row_pairs import like_rows, prefetch_tile_rows, rows_chunk, rows_halves, rows_scale_min, store_difference

FUSABLE = True           # several matrices concatenated, one output per part
TYPE_SIZE = 144
GROUP_BLOCK_BYTES = 1152
_SCALES, _CHUNKS = 32, 128     # offsets in a packed super-block


def dequantize(blocks: np.ndarray) -> np.ndarray:
    """NumPy reference: GGUF blocks (n, 144) u8 -> (n, 256) f32."""
    sc, m = scales_and_mins(blocks[:, 4:16])
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 0x0F).reshape(-1, 8, 32).astype(np.float32)
    scale = (dequantize_halves(blocks, 0) * sc)[:, :, None]
    offset = (dequantize_halves(blocks, 2) * m)[:, :, None]
    return (scale * q - offset).reshape(-1, 256)


@njit(cache=True)
def _pack_groups(raw, packed):
    for g in range(packed.shape[0]):
        for r in range(ROWS_PER_GROUP):
            source = raw[g * ROWS_PER_GROUP + r]
            for b in range(raw.shape[1] // TYPE_SIZE):
                src, dst = b * TYPE_SIZE, b * GROUP_BLOCK_BYTES
                put_halves(source, src, packed[g], dst, r)
                put_halves(source, src + 2, packed[g], dst + 16, r)
                put_transposed(source, src + 4, 12, packed[g], dst + _SCALES, r)
                for chunk in range(32):
                    put_chunk(source, src + 16 + 4 * chunk, packed[g], dst + _CHUNKS + 32 * chunk, r)


def pack(raw: np.ndarray) -> tuple:
    """GGUF rows (rows, nb*144) -> (packed groups, tail rows); see the layout above."""
    return repack_k(raw, _pack_groups)


@njit(cache=True, inline="always")
def _sub_pair(w, at, x, x_at):
    """Sub-blocks 2j (low nibbles) and 2j+1 (high) of 8 rows, 8 chunks from w[at], against
    x[x_at..x_at+63] -> (their dots, 16 x the high one's), I32x8 each (exact)."""
    if wide_dot4_available():
        return _sub_pair_wide(w, at, x, x_at)
    low = high16 = zeros_i32x8()
    for c in range(8):
        q = load_i8x32(w, at + 32 * c)
        low = dot4_acc(low, low_nibbles(q), broadcast_i8x4(x, x_at + 4 * c))
        high16 = dot4_high_nibbles_acc(high16, q, broadcast_i8x4(x, x_at + 32 + 4 * c))
    return low, high16


@njit(cache=True, inline="always")
def _sub_pair_wide(w, at, x, x_at):
    """_sub_pair with 16-lane vpdpbusd: chunks c and c+1 as one 64-byte vector (lanes 8-15 the
    second's rows), each half against its chunk's activations; the halves' sums added at the end
    (integers: the same result)."""
    # Half the instructions per weight byte keeps more loads in flight while a decode step streams
    # the weights. The 4-token tiles go 16 lanes wide by taking two row groups instead, which
    # needs no spreading (on the Intel Xeon host a 512-bit vpdpbusd costs about one 256-bit one).
    low = high16 = concat(zeros_i32x8(), zeros_i32x8())
    for c in range(0, 8, 2):
        q = load_i8x64(w, at + 32 * c)
        low = dot4_acc(low, low_nibbles(q), spread_word_pair(x, x_at + 4 * c))
        high16 = dot4_high_nibbles_acc(high16, q, spread_word_pair(x, x_at + 32 + 4 * c))
    return add(low_half(low), high_half(low)), add(low_half(high16), high_half(high16))


@njit(cache=True, inline="always")
def _pair_sums(w, base, x, bsums, b, j):
    """(S, M) of sub-blocks 2j, 2j+1 of super-block b (packed at w[base]) for 8 rows, I32x8 each."""
    low, high16 = _sub_pair(w, base + _CHUNKS + 256 * j, x, b * 256 + 64 * j)
    scale0, min0 = scale_min_rows(w, base + _SCALES, 2 * j)
    scale1, min1 = scale_min_rows(w, base + _SCALES, 2 * j + 1)
    return _scaled(low, high16, scale0, scale1), _min_sum(w, _min_pairs(min0, min1), bsums, b * 16 + 4 * j)


@njit(cache=True, inline="always")
def _scaled(low, high16, scale0, scale1):
    """S of a pair of sub-blocks from their dots (the high one's 16x): exact I32x8 (I32x16)."""
    # scale * (16 * dot) is a multiple of 16: the shift is exact
    return add(mul_i32(low, scale0), shift_right_signed(mul_i32(high16, scale1), 4))


@njit(cache=True, inline="always")
def _min_pairs(min0, min1):
    """The mins of sub-blocks 2j and 2j+1 (0..63) as the two int16 halves of each lane, for _min_sum."""
    return bits_or(min0, shift_left(min1, 16))


@njit(cache=True, inline="always")
def _min_sum(rows, min_pairs, sums, at):
    """M of a pair of sub-blocks: their mins (_min_pairs) times the token's 32-value sums at pair
    `at` (each within int16: |sum| <= 32 * 128), one pmaddwd; I32x8 (I32x16 for a pair of groups)."""
    sum_pairs = (np.int32(pair_sum(sums, at)) & 0xFFFF) | (np.int32(pair_sum(sums, at + 2)) << 16)
    return dot_halves_i16(min_pairs, like_rows(splat_i32(sum_pairs), rows))


@njit(cache=True)
def _group_one(w, xq, xd, bsums, out, t, col):
    """8 rows (packed Q4_K group w) x token t -> out[t, col:col+8], the gemv's order."""
    align_stack_frame()
    acc = acc_min = zeros_f32x8()
    x, sums = xq[t], bsums[t]
    for b in range(xd.shape[1]):
        base = b * GROUP_BLOCK_BYTES
        prefetch_streamed_lines(w, base, 18)
        s0, m0 = _pair_sums(w, base, x, sums, b, 0)
        s1, m1 = _pair_sums(w, base, x, sums, b, 1)
        s2, m2 = _pair_sums(w, base, x, sums, b, 2)
        s3, m3 = _pair_sums(w, base, x, sums, b, 3)
        dx = splat_f32(xd[t, b])
        acc = fma(to_f32(add(add(s0, s1), add(s2, s3))), mul(load_halves_as_f32(w, base), dx), acc)
        acc_min = fma(to_f32(add(add(m0, m1), add(m2, m3))), mul(load_halves_as_f32(w, base + 16), dx), acc_min)
    store_f32x8(out[t], col, sub(acc, acc_min))


@njit(cache=True, inline="always")
def _tile_pair(rows, at, x0, x1, x2, x3, x_at):
    """_sub_pair of a group or a pair of groups (row_pairs) for 4 tokens: each chunk loaded and its
    low nibbles taken once for all four."""
    l0 = l1 = l2 = l3 = h0 = h1 = h2 = h3 = like_rows(zeros_i32x8(), rows)
    for c in range(8):
        q = rows_chunk(rows, at + 32 * c)
        low = low_nibbles(q)
        lo_at, hi_at = x_at + 4 * c, x_at + 32 + 4 * c
        l0 = dot4_acc(l0, low, like_rows(broadcast_i8x4(x0, lo_at), rows))
        h0 = dot4_high_nibbles_acc(h0, q, like_rows(broadcast_i8x4(x0, hi_at), rows))
        l1 = dot4_acc(l1, low, like_rows(broadcast_i8x4(x1, lo_at), rows))
        h1 = dot4_high_nibbles_acc(h1, q, like_rows(broadcast_i8x4(x1, hi_at), rows))
        l2 = dot4_acc(l2, low, like_rows(broadcast_i8x4(x2, lo_at), rows))
        h2 = dot4_high_nibbles_acc(h2, q, like_rows(broadcast_i8x4(x2, hi_at), rows))
        l3 = dot4_acc(l3, low, like_rows(broadcast_i8x4(x3, lo_at), rows))
        h3 = dot4_high_nibbles_acc(h3, q, like_rows(broadcast_i8x4(x3, hi_at), rows))
    return l0, l1, l2, l3, h0, h1, h2, h3


@njit(cache=True, inline="always")
def _tile_token(rows, low, high16, scale0, scale1, min_pairs, sums, at, dd, dmin, acc, acc_min):
    """One token's S, M of a pair of sub-blocks into its gemm-order accumulators."""
    return fma(to_f32(_scaled(low, high16, scale0, scale1)), dd, acc), \
        fma(to_f32(_min_sum(rows, min_pairs, sums, at)), dmin, acc_min)


@njit(cache=True)
def _group_tile(rows, xq, xd, bsums, dest, t0, t1, t2, t3):
    """A packed Q4_K group, or a pair of them (row_pairs), x tokens t0, t1, t2, t3 (a gemm tile,
    repeats allowed) -> dest, the gemm's order; the weights are unpacked once for the 4 tokens."""
    align_stack_frame()
    a0 = a1 = a2 = a3 = m0 = m1 = m2 = m3 = like_rows(zeros_f32x8(), rows)
    x0, x1, x2, x3 = xq[t0], xq[t1], xq[t2], xq[t3]
    s0, s1, s2, s3 = bsums[t0], bsums[t1], bsums[t2], bsums[t3]
    for b in range(xd.shape[1]):
        base = b * GROUP_BLOCK_BYTES
        d, dmin = rows_halves(rows, base), rows_halves(rows, base + 16)
        e0, e1 = like_rows(splat_f32(xd[t0, b]), rows), like_rows(splat_f32(xd[t1, b]), rows)
        e2, e3 = like_rows(splat_f32(xd[t2, b]), rows), like_rows(splat_f32(xd[t3, b]), rows)
        for j in range(4):
            scale0, min0 = rows_scale_min(rows, base + _SCALES, 2 * j)
            scale1, min1 = rows_scale_min(rows, base + _SCALES, 2 * j + 1)
            l0, l1, l2, l3, h0, h1, h2, h3 = _tile_pair(rows, base + _CHUNKS + 256 * j, x0, x1, x2, x3,
                                                        b * 256 + 64 * j)
            at, mins = b * 16 + 4 * j, _min_pairs(min0, min1)
            a0, m0 = _tile_token(rows, l0, h0, scale0, scale1, mins, s0, at, mul(d, e0), mul(dmin, e0), a0, m0)
            a1, m1 = _tile_token(rows, l1, h1, scale0, scale1, mins, s1, at, mul(d, e1), mul(dmin, e1), a1, m1)
            a2, m2 = _tile_token(rows, l2, h2, scale0, scale1, mins, s2, at, mul(d, e2), mul(dmin, e2), a2, m2)
            a3, m3 = _tile_token(rows, l3, h3, scale0, scale1, mins, s3, at, mul(d, e3), mul(dmin, e3), a3, m3)
    store_difference(dest, t0, a0, m0)
    store_difference(dest, t1, a1, m1)
    store_difference(dest, t2, a2, m2)
    store_difference(dest, t3, a3, m3)


@njit(cache=True, inline="always")      # common.py, run_serial
def _group_one_tile(rows, xq, xd, bsums, dest, t0, t1, t2, t3):
    """_group_one for 4 tokens (distinct) x a packed group or a pair of them (row_pairs) -> dest: the
    gemv's order for each, as if each ran alone, with every chunk loaded and its low nibbles taken
    once for all four (decode steps of 4+ sessions)."""
    a0 = a1 = a2 = a3 = m0 = m1 = m2 = m3 = like_rows(zeros_f32x8(), rows)
    x0, x1, x2, x3 = xq[t0], xq[t1], xq[t2], xq[t3]
    u0, u1, u2, u3 = bsums[t0], bsums[t1], bsums[t2], bsums[t3]
    for b in range(xd.shape[1]):
        base = b * GROUP_BLOCK_BYTES
        prefetch_tile_rows(rows, base, 18)
        s0 = s1 = s2 = s3 = n0 = n1 = n2 = n3 = like_rows(zeros_i32x8(), rows)
        for j in range(4):
            scale0, min0 = rows_scale_min(rows, base + _SCALES, 2 * j)
            scale1, min1 = rows_scale_min(rows, base + _SCALES, 2 * j + 1)
            l0, l1, l2, l3, h0, h1, h2, h3 = _tile_pair(rows, base + _CHUNKS + 256 * j, x0, x1, x2, x3,
                                                        b * 256 + 64 * j)
            at, mins = b * 16 + 4 * j, _min_pairs(min0, min1)
            s0, n0 = add(s0, _scaled(l0, h0, scale0, scale1)), add(n0, _min_sum(rows, mins, u0, at))
            s1, n1 = add(s1, _scaled(l1, h1, scale0, scale1)), add(n1, _min_sum(rows, mins, u1, at))
            s2, n2 = add(s2, _scaled(l2, h2, scale0, scale1)), add(n2, _min_sum(rows, mins, u2, at))
            s3, n3 = add(s3, _scaled(l3, h3, scale0, scale1)), add(n3, _min_sum(rows, mins, u3, at))
        d, dmin = rows_halves(rows, base), rows_halves(rows, base + 16)
        e0, e1 = like_rows(splat_f32(xd[t0, b]), rows), like_rows(splat_f32(xd[t1, b]), rows)
        e2, e3 = like_rows(splat_f32(xd[t2, b]), rows), like_rows(splat_f32(xd[t3, b]), rows)
        a0, m0 = fma(to_f32(s0), mul(d, e0), a0), fma(to_f32(n0), mul(dmin, e0), m0)
        a1, m1 = fma(to_f32(s1), mul(d, e1), a1), fma(to_f32(n1), mul(dmin, e1), m1)
        a2, m2 = fma(to_f32(s2), mul(d, e2), a2), fma(to_f32(n2), mul(dmin, e2), m2)
        a3, m3 = fma(to_f32(s3), mul(d, e3), a3), fma(to_f32(n3), mul(dmin, e3), m3)
    store_difference(dest, t0, a0, m0)
    store_difference(dest, t1, a1, m1)
    store_difference(dest, t2, a2, m2)
    store_difference(dest, t3, a3, m3)


@njit(cache=True, inline="always")
def _gemm_tokens(rows, xq, xd, bsums, dest, call_index, call_length):
    """Every token in a gemm tile of its call x a group or a pair of groups (row_pairs) -> dest,
    4 tokens at a time."""
    p0 = p1 = p2 = pending = 0                      # tokens waiting for a full tile
    for t in range(xd.shape[0]):
        if not in_gemm_tile(call_index, call_length, t):
            continue
        if pending == 3:
            _group_tile(rows, xq, xd, bsums, dest, p0, p1, p2, t)
            pending = 0
        else:
            pending, p0, p1, p2 = hold(pending, p0, p1, p2, t)
    if pending > 0:                                 # a short last tile repeats its last token
        _group_tile(rows, xq, xd, bsums, dest, p0, held(min(1, pending - 1), p0, p1, p2),
                    held(pending - 1, p0, p1, p2), held(pending - 1, p0, p1, p2))


@njit(cache=True, inline="always")
def _gemv_tiles(rows, xq, xd, bsums, dest, call_index, call_length):
    """The tokens not in a gemm tile x a group or a pair of groups (row_pairs) -> dest, 4 at a time
    -> (count, t0, t1, t2): the fewer than 4 left over (_gemv_alone)."""
    g0 = g1 = g2 = pending = 0                      # tokens waiting for 3 more
    for t in range(xd.shape[0]):
        if in_gemm_tile(call_index, call_length, t):
            continue
        if pending == 3:
            _group_one_tile(rows, xq, xd, bsums, dest, g0, g1, g2, t)
            pending = 0
        else:
            pending, g0, g1, g2 = hold(pending, g0, g1, g2, t)
    return pending, g0, g1, g2


@njit(cache=True, inline="always")
def _gemv_alone(w, xq, xd, bsums, out, col, pending, g0, g1, g2):
    """The tokens _gemv_tiles left over x the packed group w -> out[t, col:col+8], one at a time."""
    for k in range(pending):
        _group_one(w, xq, xd, bsums, out, held(k, g0, g1, g2), col)


@njit(cache=True, inline="always")
def _any_gemm_token(call_index, call_length):
    """Some token of this kernel call is in a gemm tile (a prompt step)."""
    for t in range(call_length.shape[0]):
        if in_gemm_tile(call_index, call_length, t):
            return True
    return False


@njit(cache=True)
def _groups(first, last, packed, acts, outs, part_ends):
    """Row groups first..last-1 of packed x the activations -> their columns of outs (every token).
    With 16-lane VNNI the 4-token tiles (gemm and gemv orders) take two groups at once."""
    align_stack_frame()
    xq, xd, bsums, call_index, call_length = acts
    pairs = wide_dot4_available()
    gemm = _any_gemm_token(call_index, call_length)
    i = first
    while i < last:                                 # groups in memory order (a decode step streams them)
        part, col = locate(part_ends, i)
        if pairs and i + 1 < last:
            part1, col1 = locate(part_ends, i + 1)
            rows, dest = (packed[i], packed[i + 1]), (outs[part], col, outs[part1], col1)
            if gemm:
                _gemm_tokens(rows, xq, xd, bsums, dest, call_index, call_length)
            pending, g0, g1, g2 = _gemv_tiles(rows, xq, xd, bsums, dest, call_index, call_length)
            _gemv_alone(packed[i], xq, xd, bsums, outs[part], col, pending, g0, g1, g2)
            _gemv_alone(packed[i + 1], xq, xd, bsums, outs[part1], col1, pending, g0, g1, g2)
            i += 2
        else:
            dest = (outs[part], col)
            if gemm:
                _gemm_tokens(packed[i], xq, xd, bsums, dest, call_index, call_length)
            pending, g0, g1, g2 = _gemv_tiles(packed[i], xq, xd, bsums, dest, call_index, call_length)
            _gemv_alone(packed[i], xq, xd, bsums, outs[part], col, pending, g0, g1, g2)
            i += 1


@njit(cache=True)
def _tail(tail, acts, outs, part_ends):
    """The rows after the last full group (GGUF layout) x every token -> the last columns of the last out."""
    xq, xd, bsums, call_index, call_length = acts
    out = outs[part_ends.shape[0] - 1]
    first = out.shape[1] - tail.shape[0]
    for r in range(tail.shape[0]):
        for t in range(xd.shape[0]):
            out[t, first + r] = row_dot(tail[r], xq[t], xd[t], bsums[t], in_gemm_tile(call_index, call_length, t))


@njit(cache=True)
def row_dot(row, xq, xd, bsums, per_pair):
    """One Q4_K row (nb*144 B) . one token's Q8_K activations -> float32, in the gemm's order
    (per_pair) or the gemv's."""
    acc = acc_min = np.float32(0.0)
    for b in range(xd.shape[0]):
        base = b * TYPE_SIZE
        dd, dmin = scale_at(row, base) * xd[b], scale_at(row, base + 2) * xd[b]
        s_total = m_total = np.int32(0)
        for j in range(4):
            s = m = np.int32(0)
            for h in range(2):
                scale, minimum = scale_min(row, base + 4, 2 * j + h)
                isum = np.int32(0)
                for i in range(32):
                    q = (np.int32(row[base + 16 + 32 * j + i]) >> (4 * h)) & 15
                    isum += q * np.int32(xq[b * 256 + 64 * j + 32 * h + i])
                s += scale * isum
                m += minimum * pair_sum(bsums, b * 16 + 4 * j + 2 * h)
            if per_pair:
                acc = fma(np.float32(s), dd, acc)
                acc_min = fma(np.float32(m), dmin, acc_min)
            s_total += s
            m_total += m
        if not per_pair:
            acc = fma(np.float32(s_total), dd, acc)
            acc_min = fma(np.float32(m_total), dmin, acc_min)
    return acc - acc_min


@njit(cache=True, nogil=True)
def embed_rows(raw, rows, out):
    """Dequantize rows (T,) of a GGUF-layout Q4_K matrix (vocab, nb*144) -> out (T, n) f32 (llama.cpp's
    dequantize_row_q4_K: (d * sc) * q - dmin * m)."""
    for t in range(rows.shape[0]):
        source = raw[rows[t]]
        for b in range(out.shape[1] // 256):
            base = b * TYPE_SIZE
            d, dmin = scale_at(source, base), scale_at(source, base + 2)
            for s in range(8):
                scale, minimum = scale_min(source, base + 4, s)
                d1, m1 = d * np.float32(scale), dmin * np.float32(minimum)
                for i in range(32):
                    q = (np.int32(source[base + 16 + 32 * (s // 2) + i]) >> (4 * (s % 2))) & 15
                    out[t, b * 256 + 32 * s + i] = d1 * np.float32(q) - m1


# ------------------------------------------------------------------ the two entry points

@njit(MATMUL_SIGNATURE, cache=True, nogil=True)
def matmul_serial(packed, tail, part_ends, x, scratch, outs):
    """W Q4_K packed + tail @ x (T, K) -> outs (kernels/quants/common.py), on this thread."""
    run_serial(prepare_q8_k, _groups, _tail, packed, tail, part_ends, x, scratch, outs)


@njit(MATMUL_SIGNATURE, cache=True, parallel=True)
def matmul_parallel(packed, tail, part_ends, x, scratch, outs):
    """The same on numba's thread pool when big enough."""
    run_parallel(prepare_q8_k, _groups, _tail, packed, tail, part_ends, x, scratch, outs)
