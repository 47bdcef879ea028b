"""Q4_1: blocks of 32 weights in 20 bytes: f16 d, f16 m, 16 nibble bytes; w = d * q + m.

Nibble order (GGUF): byte j holds weight j in its low nibble and weight j+16 in its high one.
Activations: Q8_1 (kernels/quantize.py: int8 q, f16-rounded d and s = d * sum(q) per 32).
Packed layout (a group of 8 rows, per block, 160 bytes): d[8] f16 | m[8] f16 | 2 chunks k of
64 bytes, row r's GGUF nibble bytes 8k..8k+7 at 8r (rows after the last full group stay in GGUF
layout, the "tail"). Each 4-byte word of a chunk holds one row's 4-weight group 2k+j (low
nibbles, j = 0, 1) and 4+2k+j (high): exactly the groups llama.cpp's AVX2
ggml_vec_dot_q4_1_q8_1 sums into one float lane, so the result is bit-equal to llama.cpp's:
    a_l = fma(d_w * d_x, isum_l, a_l) block after block;  summs = fma(m_w, s_x, summs)
    result = ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)) + summs
A chunk's low (high) nibbles are one 16-lane vector: lane 2r+j is row r's lane 2k+j (4+2k+j),
one vpdpbusd against the token's 8 activation bytes repeated, so a block is 4 such vectors per
token and 8 rows (kernels/quants/lanes.py, wide_block); 4 tokens (a prompt's tiles, a decode
step of 4+ sessions) share each chunk's load and unpacking, every token's lanes in registers.
"""
import numpy as np
from numba import njit

from ..simd import add, align_stack_frame, fma, store_f32x8, zeros_f32x8
from ..simd_int import high_nibbles, load_i8x64, low_nibbles
from .common import (MATMUL_SIGNATURE, dequantize_halves, locate, nibbles, quantize_with_sums, repack, run_parallel,
                     run_serial)
from .lanes import (PREFETCH_BYTES, block_with_min, lane_sum, nibbles4, no_wide_lanes, prefetch_lines, scale_at,
                    store_tile, tile_block_with_min, tile_results_plus, tile_rows, wide_result)

FUSABLE = True           # several matrices concatenated, one output per part
SCRATCH_SLOTS = ("q8", "scales", "sums")
BLOCK_BYTES = 160        # one block of a packed group


def dequantize(blocks: np.ndarray) -> np.ndarray:
    """NumPy reference: GGUF blocks (n, 20) u8 -> (n, 32) f32."""
    return dequantize_halves(blocks, 0) * nibbles(blocks[:, 4:]) + dequantize_halves(blocks, 2)


def pack(raw: np.ndarray) -> tuple:
    """GGUF rows (rows, nb*20) -> (packed groups, tail rows); see the layout above."""
    return repack(raw, 20, 4, 8)


@njit(cache=True, inline="always")
def _nibbles(w, base):
    """The block at w[base]'s 4 value vectors: chunk 0's and 1's low nibbles, then their high ones."""
    q0, q1 = load_i8x64(w, base + 32), load_i8x64(w, base + 96)
    return low_nibbles(q0), low_nibbles(q1), high_nibbles(q0), high_nibbles(q1)


@njit(cache=True, inline="always")      # no refcount per group: common.py, run_serial
def _group(w, xq, xd, xs, out, t0, col):
    """8 rows (packed Q4_1 group w) x tokens t0..t0+3 -> out[t, col:col+8]."""
    x = tile_rows(xq, t0)
    accs = no_wide_lanes(), no_wide_lanes(), no_wide_lanes(), no_wide_lanes()
    summs = zeros_f32x8(), zeros_f32x8(), zeros_f32x8(), zeros_f32x8()
    for b in range(xd.shape[1]):
        base = b * BLOCK_BYTES
        prefetch_lines(w, base + PREFETCH_BYTES, 3)
        accs, summs = tile_block_with_min(_nibbles(w, base), w, base, x, b * 32, xd, xs, t0, b, accs, summs)
    store_tile(out, t0, col, tile_results_plus(accs, summs))


@njit(cache=True, inline="always")
def _group_one(w, xq, xd, xs, out, t, col):
    """8 rows (packed Q4_1 group w) x token t -> out[t, col:col+8]."""
    x = xq[t]
    acc, summs = no_wide_lanes(), zeros_f32x8()
    for b in range(xd.shape[1]):
        base = b * BLOCK_BYTES
        prefetch_lines(w, base + PREFETCH_BYTES, 3)
        acc, summs = block_with_min(_nibbles(w, base), w, base, x, b * 32, xd[t, b], xs[t, b], acc, summs)
    store_f32x8(out[t], col, add(wide_result(acc), summs))


@njit(cache=True)
def _groups(first, last, packed, acts, outs, part_ends):
    align_stack_frame()
    xq, xd, xs = acts
    num_tokens = xd.shape[0]
    full_tiles = num_tokens // 4 * 4
    for i in range(first, last):
        part, col = locate(part_ends, i)
        out = outs[part]
        for t0 in range(0, full_tiles, 4):
            _group(packed[i], xq, xd, xs, out, t0, col)
        for t in range(full_tiles, num_tokens):
            _group_one(packed[i], xq, xd, xs, out, t, col)


@njit(cache=True)
def _tail(tail, acts, outs, part_ends):
    xq, xd, xs = acts
    out = outs[part_ends.shape[0] - 1]
    first = out.shape[1] - tail.shape[0]
    for r in range(tail.shape[0]):
        for t in range(xd.shape[0]):
            out[t, first + r] = row_dot(tail[r], xq[t], xd[t], xs[t])


@njit(cache=True)
def row_dot(row, xq, xd, xs):
    """One Q4_1 row (nb*20 B) . one token's Q8_1 activations -> float32 (llama.cpp's order)."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = summs = np.float32(0.0)
    for b in range(xd.shape[0]):
        base = b * 20
        dd = scale_at(row, base) * xd[b]
        summs = fma(scale_at(row, base + 2), xs[b], summs)
        q, x = base + 4, b * 32
        a0 = fma(dd, nibbles4(row, q, 0, xq, x), a0)
        a1 = fma(dd, nibbles4(row, q + 4, 0, xq, x + 4), a1)
        a2 = fma(dd, nibbles4(row, q + 8, 0, xq, x + 8), a2)
        a3 = fma(dd, nibbles4(row, q + 12, 0, xq, x + 12), a3)
        a4 = fma(dd, nibbles4(row, q, 4, xq, x + 16), a4)
        a5 = fma(dd, nibbles4(row, q + 4, 4, xq, x + 20), a5)
        a6 = fma(dd, nibbles4(row, q + 8, 4, xq, x + 24), a6)
        a7 = fma(dd, nibbles4(row, q + 12, 4, xq, x + 28), a7)
    return lane_sum(a0, a1, a2, a3, a4, a5, a6, a7) + summs


# ------------------------------------------------------------------ the two entry points

@njit(MATMUL_SIGNATURE, cache=True, nogil=True)
def matmul_serial(packed, tail, part_ends, x, scratch, outs):
    """W Q4_1 packed + tail @ x (T, K) -> outs (kernels/quants/common.py), on this thread."""
    run_serial(quantize_with_sums, _groups, _tail, packed, tail, part_ends, x, scratch, outs)


@njit(MATMUL_SIGNATURE, cache=True, parallel=True)
def matmul_parallel(packed, tail, part_ends, x, scratch, outs):
    """The same on numba's thread pool when big enough."""
    run_parallel(quantize_with_sums, _groups, _tail, packed, tail, part_ends, x, scratch, outs)
