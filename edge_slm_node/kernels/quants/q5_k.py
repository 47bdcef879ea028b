"""Q5_K: super-blocks of 256 weights in 176 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales and
mins (as Q4_K), 32 bytes qh, 128 nibble bytes; weight 64j+i (i < 32) = qs[32j+i] low nibble |
bit 2j of qh[i] << 4, weight 64j+32+i = high nibble | bit 2j+1 of qh[i] << 4; w = d * sc_s * q - dmin * m_s.

Packed layout (a group of 8 rows, per super-block, 1408 bytes; kernels/quants/kquants.py):
d[8] f16 | dmin[8] f16 | the 12 scale bytes transposed (96 B) | per lane l (0..7): a chunk of
row r's qh[4l..4l+3], then 4 chunks j of its qs[32j+4l..32j+4l+3] (32 B each, row r at 4r).
Activations: Q8_K. llama.cpp's x86 build runs ggml_vec_dot_q5_K_q8_K (AVX2) for prompts and
decode alike (no repacking on x86): 8 lanes per row, lane l the exact integer
    S_l = sum over j of sc_2j * (q . x over weights 64j+4l..+3) + sc_2j+1 * (over 64j+32+4l..+3)
a_l = fma(d * d_x, float(S_l), a_l), summs = fma(-d_x * dmin, float(sum of m_s * bsum32_s), summs),
result ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)) + summs. Calls with 8 or more tokens go
to llama.cpp's tiled K-quant matmul (ggml-cpu/tiled, AVX-512 VNNI microkernel), which per
super-block takes the exact integers S = sum of the S_l and M = sum of m_s * bsum32_s and
accumulates acc = fma(fma(-float(M), dmin, float(S) * d), d_x, acc). The kernels here do the
same, choosing per token by the size of the llama.cpp call it belongs to (scratch.call_length,
kernels/quants/common.py), not by what else shares the kernel call.
"""
import numpy as np
from numba import njit

from ..simd import (add, align_stack_frame, fma, load_halves_as_f32, mul, splat_f32, splat_i32, store_f32x8,
                    to_f32, zeros_f32x8)
from ..simd_int import (bits_or, broadcast_i8x4, dot_pairs_i16, dot_pairs_u8_i8, high_nibbles, i16_pairs,
                        load_i8x32, low_nibbles, mul_i32)
from ..vec8 import sub
from .bits5 import fifth_bits
from .common import MATMUL_SIGNATURE, ROWS_PER_GROUP, dequantize_halves, locate, run_parallel, run_serial
from .kquants import (SCRATCH_SLOTS, in_tiled_call, pair_sum, prepare_q8_k, put_chunk, put_halves,  # noqa: F401
                      put_transposed, repack_k, scale_min, scale_min_rows, scales_and_mins)
from .lanes import PREFETCH_BYTES, lane_sum, prefetch_lines, scale_at, vector_lane_sum

FUSABLE = True           # several matrices concatenated, one output per part
TYPE_SIZE = 176
GROUP_BLOCK_BYTES = 1408
_SCALES, _LANES = 32, 128      # offsets in a packed super-block


def dequantize(blocks: np.ndarray) -> np.ndarray:
    """NumPy reference: GGUF blocks (n, 176) u8 -> (n, 256) f32."""
    sc, m = scales_and_mins(blocks[:, 4:16])
    qs = blocks[:, 48:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    qh = blocks[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    q = ((qs & 0x0F).reshape(-1, 8, 32) | ((qh & 1) << 4)).astype(np.float32)
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
                for lane in range(8):
                    at = dst + _LANES + 160 * lane
                    put_chunk(source, src + 16 + 4 * lane, packed[g], at, r)
                    for j in range(4):
                        put_chunk(source, src + 48 + 32 * j + 4 * lane, packed[g], at + 32 + 32 * j, r)


def pack(raw: np.ndarray) -> tuple:
    """GGUF rows (rows, nb*176) -> (packed groups, tail rows); see the layout above."""
    return repack_k(raw, _pack_groups)


@njit(cache=True, inline="always")
def _pair(w, at, bits, j, x, x_at, low_scale, high_scale):
    """Sub-blocks 2j, 2j+1 of one lane for 8 rows (nibbles at w[at], 5th bits in bits) . x[x_at..+3]
    and x[x_at+32..+3], times their scales -> I32x8 (exact)."""
    q = load_i8x32(w, at)
    low = dot_pairs_u8_i8(bits_or(low_nibbles(q), fifth_bits(bits, 2 * j)), broadcast_i8x4(x, x_at))
    high = dot_pairs_u8_i8(bits_or(high_nibbles(q), fifth_bits(bits, 2 * j + 1)), broadcast_i8x4(x, x_at + 32))
    return add(dot_pairs_i16(low, low_scale), dot_pairs_i16(high, high_scale))


TILED_MIN_TOKENS = 8            # llama.cpp's tiled matmul takes calls with at least this many tokens


@njit(cache=True, inline="always")
def _lane(w, base, x, b, lane, e0, e1, e2, e3, e4, e5, e6, e7):
    """S_lane (I32x8) of super-block b for 8 rows; e0..e7: the 8 sub-block scales (I16x16)."""
    at, x_at = base + _LANES + 160 * lane, b * 256 + 4 * lane
    bits = load_i8x32(w, at)
    s = add(_pair(w, at + 32, bits, 0, x, x_at, e0, e1), _pair(w, at + 64, bits, 1, x, x_at + 64, e2, e3))
    s = add(s, _pair(w, at + 96, bits, 2, x, x_at + 128, e4, e5))
    return add(s, _pair(w, at + 128, bits, 3, x, x_at + 192, e6, e7))


@njit(cache=True, inline="always")
def _scale_pairs(w, base, sums, b, s):
    """(scale of sub-block s as the I16x16 multiplier, its min * bsum32 as I32x8) for 8 rows."""
    scale, minimum = scale_min_rows(w, base + _SCALES, s)
    return i16_pairs(scale), mul_i32(minimum, splat_i32(pair_sum(sums, b * 16 + 2 * s)))


@njit(cache=True)
def _group_one(w, xq, xd, bsums, out, t, col):
    """8 rows (packed Q5_K group w) x token t -> out[t, col:col+8]."""
    align_stack_frame()
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = summs = zeros_f32x8()
    x, sums = xq[t], bsums[t]
    for b in range(xd.shape[1]):
        base = b * GROUP_BLOCK_BYTES
        prefetch_lines(w, base + PREFETCH_BYTES, 22)
        e0, m0 = _scale_pairs(w, base, sums, b, 0)
        e1, m1 = _scale_pairs(w, base, sums, b, 1)
        e2, m2 = _scale_pairs(w, base, sums, b, 2)
        e3, m3 = _scale_pairs(w, base, sums, b, 3)
        e4, m4 = _scale_pairs(w, base, sums, b, 4)
        e5, m5 = _scale_pairs(w, base, sums, b, 5)
        e6, m6 = _scale_pairs(w, base, sums, b, 6)
        e7, m7 = _scale_pairs(w, base, sums, b, 7)
        mins = add(add(add(m0, m1), add(m2, m3)), add(add(m4, m5), add(m6, m7)))
        summs = fma(mul(load_halves_as_f32(w, base + 16), splat_f32(-xd[t, b])), to_f32(mins), summs)
        dd = mul(load_halves_as_f32(w, base), splat_f32(xd[t, b]))
        a0 = fma(dd, to_f32(_lane(w, base, x, b, 0, e0, e1, e2, e3, e4, e5, e6, e7)), a0)
        a1 = fma(dd, to_f32(_lane(w, base, x, b, 1, e0, e1, e2, e3, e4, e5, e6, e7)), a1)
        a2 = fma(dd, to_f32(_lane(w, base, x, b, 2, e0, e1, e2, e3, e4, e5, e6, e7)), a2)
        a3 = fma(dd, to_f32(_lane(w, base, x, b, 3, e0, e1, e2, e3, e4, e5, e6, e7)), a3)
        a4 = fma(dd, to_f32(_lane(w, base, x, b, 4, e0, e1, e2, e3, e4, e5, e6, e7)), a4)
        a5 = fma(dd, to_f32(_lane(w, base, x, b, 5, e0, e1, e2, e3, e4, e5, e6, e7)), a5)
        a6 = fma(dd, to_f32(_lane(w, base, x, b, 6, e0, e1, e2, e3, e4, e5, e6, e7)), a6)
        a7 = fma(dd, to_f32(_lane(w, base, x, b, 7, e0, e1, e2, e3, e4, e5, e6, e7)), a7)
    store_f32x8(out[t], col, add(vector_lane_sum(a0, a1, a2, a3, a4, a5, a6, a7), summs))


@njit(cache=True)
def _group_tiled(w, xq, xd, bsums, out, t, col):
    """8 rows (packed Q5_K group w) x token t of a call with >= 8 tokens -> out[t, col:col+8], the
    tiled matmul's order."""
    align_stack_frame()
    acc = zeros_f32x8()
    x, sums = xq[t], bsums[t]
    for b in range(xd.shape[1]):
        base = b * GROUP_BLOCK_BYTES
        e0, m0 = _scale_pairs(w, base, sums, b, 0)
        e1, m1 = _scale_pairs(w, base, sums, b, 1)
        e2, m2 = _scale_pairs(w, base, sums, b, 2)
        e3, m3 = _scale_pairs(w, base, sums, b, 3)
        e4, m4 = _scale_pairs(w, base, sums, b, 4)
        e5, m5 = _scale_pairs(w, base, sums, b, 5)
        e6, m6 = _scale_pairs(w, base, sums, b, 6)
        e7, m7 = _scale_pairs(w, base, sums, b, 7)
        mins = add(add(add(m0, m1), add(m2, m3)), add(add(m4, m5), add(m6, m7)))
        s = add(add(add(_lane(w, base, x, b, 0, e0, e1, e2, e3, e4, e5, e6, e7),
                        _lane(w, base, x, b, 1, e0, e1, e2, e3, e4, e5, e6, e7)),
                    add(_lane(w, base, x, b, 2, e0, e1, e2, e3, e4, e5, e6, e7),
                        _lane(w, base, x, b, 3, e0, e1, e2, e3, e4, e5, e6, e7))),
                add(add(_lane(w, base, x, b, 4, e0, e1, e2, e3, e4, e5, e6, e7),
                        _lane(w, base, x, b, 5, e0, e1, e2, e3, e4, e5, e6, e7)),
                    add(_lane(w, base, x, b, 6, e0, e1, e2, e3, e4, e5, e6, e7),
                        _lane(w, base, x, b, 7, e0, e1, e2, e3, e4, e5, e6, e7))))
        scaled = mul(to_f32(s), load_halves_as_f32(w, base))
        r = fma(sub(zeros_f32x8(), to_f32(mins)), load_halves_as_f32(w, base + 16), scaled)
        acc = fma(r, splat_f32(xd[t, b]), acc)
    store_f32x8(out[t], col, acc)


@njit(cache=True)
def _groups(first, last, packed, acts, outs, part_ends):
    """Row groups first..last-1 of packed x the activations -> their columns of outs (every token)."""
    xq, xd, bsums, _, call_length = acts
    for i in range(first, last):
        part, col = locate(part_ends, i)
        out = outs[part]
        for t in range(xd.shape[0]):
            if in_tiled_call(call_length, t, TILED_MIN_TOKENS):
                _group_tiled(packed[i], xq, xd, bsums, out, t, col)
            else:
                _group_one(packed[i], xq, xd, bsums, out, t, col)


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
def _q5(row, base, i):
    """The 5-bit value (0..31) of weight i (0..255) of the GGUF super-block at row[base]."""
    j, h, e = i // 64, (i % 64) // 32, i % 32
    low = (np.int32(row[base + 48 + 32 * j + e]) >> (4 * h)) & 15
    return low | (((np.int32(row[base + 16 + e]) >> (2 * j + h)) & 1) << 4)


@njit(cache=True)
def row_dot(row, xq, xd, bsums, tiled):
    """One Q5_K row (nb*176 B) . one token's Q8_K activations -> float32 (llama.cpp's vec_dot
    order, or with `tiled` its tiled matmul's)."""
    lanes = np.zeros(8, np.float32)
    summs = acc = np.float32(0.0)
    for b in range(xd.shape[0]):
        base = b * TYPE_SIZE
        dd, dmin = xd[b] * scale_at(row, base), -xd[b] * scale_at(row, base + 2)
        mins = np.int32(0)
        for s in range(8):
            mins += scale_min(row, base + 4, s)[1] * pair_sum(bsums, b * 16 + 2 * s)
        summs = fma(dmin, np.float32(mins), summs)
        s_total = np.int32(0)
        for lane in range(8):
            total = np.int32(0)
            for s in range(8):
                isum = np.int32(0)
                for e in range(4):
                    i = 32 * s + 4 * lane + e
                    isum += _q5(row, base, i) * np.int32(xq[b * 256 + i])
                total += scale_min(row, base + 4, s)[0] * isum
            lanes[lane] = fma(dd, np.float32(total), lanes[lane])
            s_total += total
        scaled = np.float32(s_total) * scale_at(row, base)
        acc = fma(fma(-np.float32(mins), scale_at(row, base + 2), scaled), xd[b], acc)
    if tiled:
        return acc
    return lane_sum(lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5], lanes[6], lanes[7]) + summs


@njit(cache=True, nogil=True)
def embed_rows(raw, rows, out):
    """Dequantize rows (T,) of a GGUF-layout Q5_K matrix (vocab, nb*176) -> out (T, n) f32 (llama.cpp's
    dequantize_row_q5_K: (d * sc) * q - dmin * m)."""
    for t in range(rows.shape[0]):
        source = raw[rows[t]]
        for b in range(out.shape[1] // 256):
            base = b * TYPE_SIZE
            d, dmin = scale_at(source, base), scale_at(source, base + 2)
            for s in range(8):
                scale, minimum = scale_min(source, base + 4, s)
                d1, m1 = d * np.float32(scale), dmin * np.float32(minimum)
                for i in range(32):
                    out[t, b * 256 + 32 * s + i] = d1 * np.float32(_q5(source, base, 32 * s + i)) - m1


# ------------------------------------------------------------------ the two entry points

@njit(MATMUL_SIGNATURE, cache=True, nogil=True)
def matmul_serial(packed, tail, part_ends, x, scratch, outs):
    """W Q5_K packed + tail @ x (T, K) -> outs (kernels/quants/common.py), on this thread."""
    run_serial(prepare_q8_k, _groups, _tail, packed, tail, part_ends, x, scratch, outs)


@njit(MATMUL_SIGNATURE, cache=True, parallel=True)
def matmul_parallel(packed, tail, part_ends, x, scratch, outs):
    """The same on numba's thread pool when big enough."""
    run_parallel(prepare_q8_k, _groups, _tail, packed, tail, part_ends, x, scratch, outs)
