"""Q5_0: blocks of 32 weights in 22 bytes: f16 d, uint32 qh (5th bits), 16 nibble bytes;
w = d * (q - 16), q = nibble | fifth bit << 4 (0..31).

Packed layout (a group of 8 rows, per block, 176 bytes): d[8] f16 | fifth bits 32 B | 2 chunks
of 64 B (kernels/quants/bits5.py). Activations: Q8_0 (kernels/quantize.py), plus per token
-16 * (the sum of each 4 consecutive q) as int32 in the q16 slot, for the -16 offset (the start
of each lane's integer sum). A block is 4 vectors of 16 lanes per token (kernels/quants/lanes.py,
wide_block_offset); 4 tokens of a prompt or a decode step share each block's unpacking.
llama.cpp's AVX2 ggml_vec_dot_q5_0_q8_0 (decode) and tinyBLAS_Q0_AVX (prompts) sum lane l over
the 4-weight group l of each block, exactly, then a_l = fma(d_w * d_x, isum_l, a_l) block after
block and ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)): every kernel here does the same, so
the results are bit-equal to llama.cpp's (isum_l = sum(q * x) - 16 * sum(x) over the group:
the same integer as its signed bytes' dot).
"""
import numpy as np
from numba import njit

from ..simd import align_stack_frame, fma, load_halves_as_f32, store_f32x8
from .bits5 import fifth_bit, five_bit_values, five_bit_vectors, repack5
from .common import MATMUL_SIGNATURE, dequantize_halves, locate, quantize_with_offsets, run_parallel, run_serial
from .lanes import (PREFETCH_BYTES, lane_sum, no_wide_lanes, prefetch_lines, scale_at, store_tile, tile_column,
                    tile_results, tile_rows, wide_block_offset, wide_result, wide_tile_offset)

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
    return quantize_with_offsets(x, scratch, -16)     # the -16 of every weight


@njit(cache=True, inline="always")      # no refcount per group: common.py, run_serial
def _group(w, xq, offsets, xd, out, t0, col):
    """8 rows (packed Q5_0 group w) x tokens t0..t0+3 -> out[t, col:col+8]."""
    x, o = tile_rows(xq, t0), tile_rows(offsets, t0)
    accs = no_wide_lanes(), no_wide_lanes(), no_wide_lanes(), no_wide_lanes()
    for b in range(xd.shape[1]):
        base = b * GROUP_BLOCK_BYTES
        prefetch_lines(w, base + PREFETCH_BYTES, 3)
        accs = wide_tile_offset(five_bit_vectors(w, base + 16, base + 48), load_halves_as_f32(w, base), x, o, b * 32,
                                tile_column(xd, t0, b), accs)
    store_tile(out, t0, col, tile_results(accs))


@njit(cache=True, inline="always")
def _group_one(w, xq, offsets, xd, out, t, col):
    """8 rows (packed Q5_0 group w) x token t -> out[t, col:col+8]."""
    x, o = xq[t], offsets[t]
    acc = no_wide_lanes()
    for b in range(xd.shape[1]):
        base = b * GROUP_BLOCK_BYTES
        prefetch_lines(w, base + PREFETCH_BYTES, 3)
        acc = wide_block_offset(five_bit_vectors(w, base + 16, base + 48), load_halves_as_f32(w, base), x, o,
                                b * 32, xd[t, b], acc)
    store_f32x8(out[t], col, wide_result(acc))


@njit(cache=True)
def _groups(first, last, packed, acts, outs, part_ends):
    """Row groups first..last-1 of packed x the activations -> their columns of outs (every token)."""
    align_stack_frame()
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
