"""Q5_0: blocks of 32 weights in 22 bytes: f16 d, uint32 qh (5th bits), 16 nibble bytes;
w = d * (q - 16), q = nibble | fifth bit << 4 (0..31).

Packed layout (a group of 8 rows, per block, 176 bytes): d[8] f16 | fifth bits 32 B | 4 chunks
of 32 B (kernels/quants/bits5.py). Activations: Q8_0 (kernels/quantize.py), plus per token
-16 * (the sum of each 4 consecutive q) in the q16 slot, for the -16 offset (the start of each
lane's integer sum). Prompts run in tiles of 4 tokens with one pass over the blocks per lane
pair (c, 4 + c): each chunk is unpacked once for 4 tokens.
llama.cpp's AVX2 ggml_vec_dot_q5_0_q8_0 (decode) and tinyBLAS_Q0_AVX (prompts) sum lane l over
the 4-weight group l of each block, exactly, then a_l = fma(d_w * d_x, isum_l, a_l) block after
block and ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)): every kernel here does the same, so
the results are bit-equal to llama.cpp's (isum_l = sum(q * x) - 16 * sum(x) over the group:
the same integer as its signed bytes' dot).
"""
import numpy as np
from numba import njit

from ..quantize import quantize_rows_q8
from ..simd import add, fma, load_halves_as_f32, mul, prefetch, splat_f32, store_f32x8, to_f32, zeros_f32x8
from ..simd_int import bits_or, broadcast_i32, broadcast_i8x4, dot4_acc, high_nibbles, load_i8x32, low_nibbles
from .bits5 import fifth_bit, fifth_bits, five_bit_values, repack5
from .common import MATMUL_SIGNATURE, dequantize_halves, locate, rows_of, run_parallel, run_serial
from .lanes import PREFETCH_BYTES, lane_sum, prefetch_lines, scale_at, vector_lane_sum

FUSABLE = True           # several matrices concatenated, one output per part
SCRATCH_SLOTS = ("q8", "q16", "scales", "sums")
TYPE_SIZE = 22
GROUP_BLOCK_BYTES = 176


def dequantize(blocks: np.ndarray) -> np.ndarray:
    """NumPy reference: GGUF blocks (n, 22) u8 -> (n, 32) f32."""
    return dequantize_halves(blocks, 0) * (five_bit_values(blocks, 2) - np.float32(16.0))


def pack(raw: np.ndarray) -> tuple:
    """GGUF rows (rows, nb*22) -> (packed groups, tail rows); see the layout above."""
    return repack5(raw, TYPE_SIZE, 2)


@njit(cache=True, inline="always")
def _prepare(x, scratch):
    """x (T, K) -> its activations for this type, quantized into scratch (see the module docstring)."""
    num_tokens, length = x.shape
    xq = rows_of(scratch.q8, num_tokens, length)
    xd = rows_of(scratch.scales, num_tokens, length // 32)
    quantize_rows_q8(x, xq, xd, rows_of(scratch.sums, num_tokens, length // 32))
    offsets = rows_of(scratch.q16, num_tokens, length // 4)
    for t in range(num_tokens):                 # -16 * sum of each 4 q: the -16 of every lane
        for k in range(length // 4):
            total = np.int32(0)
            for e in range(4):
                total += np.int32(xq[t, 4 * k + e])
            offsets[t, k] = -16 * total
    return xq, offsets, xd


@njit(cache=True, inline="always")
def _lane(q, bits, k, x, offsets, at):
    """8 rows' 5-bit weights (nibbles q, fifth bits at bit k of bits) . x[at..at+3], minus the
    offset 16 * sum(x[at..at+3]) -> F32x8 (exact integers)."""
    return _lane5(bits_or(q, fifth_bits(bits, k)), x, offsets, at)


@njit(cache=True, inline="always")
def _lane5(u5, x, offsets, at):
    """8 rows' 5-bit weights u5 (4 bytes each) . x[at..at+3] - 16 * sum(x[at..at+3]) -> F32x8 (exact)."""
    return to_f32(dot4_acc(broadcast_i32(offsets, at // 4), u5, broadcast_i8x4(x, at)))


@njit(cache=True, inline="always")
def _lane_pair(w, x0, x1, x2, x3, o0, o1, o2, o3, xd, t0, c):
    """Lanes c and 4+c (chunk c) of 4 tokens over all blocks -> a_{4+c} + a_c per token."""
    lo0 = lo1 = lo2 = lo3 = hi0 = hi1 = hi2 = hi3 = zeros_f32x8()
    blocks = xd.shape[1]
    for b in range(blocks):
        base = b * GROUP_BLOCK_BYTES
        prefetch(w, (blocks + b) * GROUP_BLOCK_BYTES + 44 * c)   # the next group, over the 4 passes
        d, bits = load_halves_as_f32(w, base), load_i8x32(w, base + 16)
        q = load_i8x32(w, base + 48 + 32 * c)
        low = bits_or(low_nibbles(q), fifth_bits(bits, 2 * c))
        high = bits_or(high_nibbles(q), fifth_bits(bits, 2 * c + 1))
        at = b * 32 + 4 * c
        dd = mul(d, splat_f32(xd[t0, b]))
        lo0, hi0 = fma(dd, _lane5(low, x0, o0, at), lo0), fma(dd, _lane5(high, x0, o0, at + 16), hi0)
        dd = mul(d, splat_f32(xd[t0 + 1, b]))
        lo1, hi1 = fma(dd, _lane5(low, x1, o1, at), lo1), fma(dd, _lane5(high, x1, o1, at + 16), hi1)
        dd = mul(d, splat_f32(xd[t0 + 2, b]))
        lo2, hi2 = fma(dd, _lane5(low, x2, o2, at), lo2), fma(dd, _lane5(high, x2, o2, at + 16), hi2)
        dd = mul(d, splat_f32(xd[t0 + 3, b]))
        lo3, hi3 = fma(dd, _lane5(low, x3, o3, at), lo3), fma(dd, _lane5(high, x3, o3, at + 16), hi3)
    return add(hi0, lo0), add(hi1, lo1), add(hi2, lo2), add(hi3, lo3)


@njit(cache=True)
def _group(w, xq, offsets, xd, out, t0, col):
    """8 rows (packed Q5_0 group w) x tokens t0..t0+3 -> out[t, col:col+8]."""
    x0, x1, x2, x3 = xq[t0], xq[t0 + 1], xq[t0 + 2], xq[t0 + 3]
    o0, o1, o2, o3 = offsets[t0], offsets[t0 + 1], offsets[t0 + 2], offsets[t0 + 3]
    p0, p1, p2, p3 = _lane_pair(w, x0, x1, x2, x3, o0, o1, o2, o3, xd, t0, 0)
    r0, r1, r2, r3 = _lane_pair(w, x0, x1, x2, x3, o0, o1, o2, o3, xd, t0, 2)
    e0, e1, e2, e3 = add(p0, r0), add(p1, r1), add(p2, r2), add(p3, r3)    # (a4+a0) + (a6+a2)
    p0, p1, p2, p3 = _lane_pair(w, x0, x1, x2, x3, o0, o1, o2, o3, xd, t0, 1)
    r0, r1, r2, r3 = _lane_pair(w, x0, x1, x2, x3, o0, o1, o2, o3, xd, t0, 3)
    store_f32x8(out[t0], col, add(e0, add(p0, r0)))                         # + ((a5+a1) + (a7+a3))
    store_f32x8(out[t0 + 1], col, add(e1, add(p1, r1)))
    store_f32x8(out[t0 + 2], col, add(e2, add(p2, r2)))
    store_f32x8(out[t0 + 3], col, add(e3, add(p3, r3)))


@njit(cache=True)
def _group_one(w, xq, offsets, xd, out, t, col):
    """8 rows (packed Q5_0 group w) x token t -> out[t, col:col+8]."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zeros_f32x8()
    x, off = xq[t], offsets[t]
    for b in range(xd.shape[1]):
        base = b * GROUP_BLOCK_BYTES
        prefetch_lines(w, base + PREFETCH_BYTES, 3)
        dd = mul(load_halves_as_f32(w, base), splat_f32(xd[t, b]))
        bits = load_i8x32(w, base + 16)
        at = b * 32
        q = load_i8x32(w, base + 48)
        a0 = fma(dd, _lane(low_nibbles(q), bits, 0, x, off, at), a0)
        a4 = fma(dd, _lane(high_nibbles(q), bits, 1, x, off, at + 16), a4)
        q = load_i8x32(w, base + 80)
        a1 = fma(dd, _lane(low_nibbles(q), bits, 2, x, off, at + 4), a1)
        a5 = fma(dd, _lane(high_nibbles(q), bits, 3, x, off, at + 20), a5)
        q = load_i8x32(w, base + 112)
        a2 = fma(dd, _lane(low_nibbles(q), bits, 4, x, off, at + 8), a2)
        a6 = fma(dd, _lane(high_nibbles(q), bits, 5, x, off, at + 24), a6)
        q = load_i8x32(w, base + 144)
        a3 = fma(dd, _lane(low_nibbles(q), bits, 6, x, off, at + 12), a3)
        a7 = fma(dd, _lane(high_nibbles(q), bits, 7, x, off, at + 28), a7)
    store_f32x8(out[t], col, vector_lane_sum(a0, a1, a2, a3, a4, a5, a6, a7))


@njit(cache=True)
def _groups(first, last, packed, acts, outs, part_ends):
    """Row groups first..last-1 of packed x the activations -> their columns of outs (every token)."""
    xq, offsets, xd = acts
    num_tokens = xd.shape[0]
    full_tiles = num_tokens // 4 * 4
    for i in range(first, last):
        part, col = locate(part_ends, i)
        out = outs[part]
        for t0 in range(0, full_tiles, 4):
            _group(packed[i], xq, offsets, xd, out, t0, col)
        for t in range(full_tiles, num_tokens):
            _group_one(packed[i], xq, offsets, xd, out, t, col)


@njit(cache=True)
def _tail(tail, acts, outs, part_ends):
    """The rows after the last full group (GGUF layout) x every token -> the last columns of the last out."""
    xq, offsets, xd = acts
    out = outs[part_ends.shape[0] - 1]
    first = out.shape[1] - tail.shape[0]
    for r in range(tail.shape[0]):
        for t in range(xd.shape[0]):
            out[t, first + r] = row_dot(tail[r], xq[t], xd[t])


@njit(cache=True)
def row_dot(row, xq, xd):
    """One Q5_0 row (nb*22 B) . one token's Q8_0 activations -> float32 (llama.cpp's order)."""
    lanes = np.zeros(8, np.float32)
    for b in range(xd.shape[0]):
        base = b * TYPE_SIZE
        dd = scale_at(row, base) * xd[b]
        for lane in range(8):
            isum = np.int32(0)
            for e in range(4):
                j = 4 * lane + e
                byte = np.int32(row[base + 6 + j % 16])
                nibble = byte & 15 if j < 16 else byte >> 4
                isum += ((nibble | fifth_bit(row, base + 2, j)) - 16) * np.int32(xq[b * 32 + j])
            lanes[lane] = fma(dd, np.float32(isum), lanes[lane])
    return lane_sum(lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5], lanes[6], lanes[7])


@njit(cache=True, nogil=True)
def embed_rows(raw, rows, out):
    """Dequantize rows (T,) of a GGUF-layout Q5_0 matrix (vocab, nb*22) -> out (T, n) f32 (llama.cpp's
    dequantize_row_q5_0: d * (q - 16))."""
    for t in range(rows.shape[0]):
        source = raw[rows[t]]
        for b in range(out.shape[1] // 32):
            d = scale_at(source, b * TYPE_SIZE)
            for j in range(32):
                byte = np.int32(source[b * TYPE_SIZE + 6 + j % 16])
                nibble = byte & 15 if j < 16 else byte >> 4
                out[t, b * 32 + j] = d * np.float32((nibble | fifth_bit(source, b * TYPE_SIZE + 2, j)) - 16)


# ------------------------------------------------------------------ the two entry points

@njit(MATMUL_SIGNATURE, cache=True, nogil=True)
def matmul_serial(packed, tail, part_ends, x, scratch, outs):
    """W Q5_0 packed + tail @ x (T, K) -> outs (kernels/quants/common.py), on this thread."""
    run_serial(_prepare, _groups, _tail, packed, tail, part_ends, x, scratch, outs)


@njit(MATMUL_SIGNATURE, cache=True, parallel=True)
def matmul_parallel(packed, tail, part_ends, x, scratch, outs):
    """The same on numba's thread pool when big enough."""
    run_parallel(_prepare, _groups, _tail, packed, tail, part_ends, x, scratch, outs)
