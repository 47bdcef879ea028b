"""Q8_0: blocks of 32 weights in 34 bytes: f16 d, 32 int8 q; w = d * q. Activations: Q8_0.

Packed layout (a group of 8 rows, per block, 272 bytes): d[8] f16 | 4 chunks k of 64 bytes, row
r's int8 weights 8k..8k+7 at 8r. Each 4-byte word of a chunk holds one row's 4-weight group 2k+j
(j = 0, 1): the group llama.cpp's AVX2 ggml_vec_dot_q8_0_q8_0 sums into float lane 2k+j, so
every kernel here is bit-equal to llama.cpp's (the lane order of kernels/quants/lanes.py). A
chunk is one 16-lane vector (lane 2r+j: row r's lane 2k+j), one vpdpbusd against the token's 8
activation bytes repeated: the weights' sign bits flipped make them unsigned (w + 128), and each
lane starts from -128 x the sum of its 4 activations (the offsets, in the q16 slot as int32), so
the integer sums are exact. 4 tokens (a prompt's tiles, a decode step of 4+ sessions) share
each chunk's load, every token's lanes in registers.
"""
import numpy as np
from numba import njit

from ..simd import align_stack_frame, fma, load_halves_as_f32, store_f32x8
from ..simd_int import load_i8x64, toggle_bits
from .common import (MATMUL_SIGNATURE, ROWS_PER_GROUP, dequantize_halves, locate, quantize_with_offsets, repack,
                     run_parallel, run_serial)
from .lanes import (PREFETCH_BYTES, int8s4, lane_sum, no_wide_lanes, prefetch_lines, scale_at, store_tile, tile_column,
                    tile_results, tile_rows, wide_block_offset, wide_result, wide_tile_offset)

FUSABLE = True           # several matrices concatenated, one output per part
SCRATCH_SLOTS = ("q8", "q16", "scales", "sums")
GROUP_BLOCK_BYTES = 272


def dequantize(blocks: np.ndarray) -> np.ndarray:
    """NumPy reference: GGUF blocks (n, 34) u8 -> (n, 32) f32."""
    return dequantize_halves(blocks, 0) * blocks[:, 2:].view(np.int8).astype(np.float32)


def pack(raw: np.ndarray) -> tuple:
    """GGUF rows (rows, nb*34) -> (packed groups, tail rows); see the layout above."""
    return repack(raw, 34, 2, 8)


@njit(cache=True, inline="always")
def _prepare(x, scratch):
    return quantize_with_offsets(x, scratch, -128)    # the -128 of every weight


@njit(cache=True, nogil=True)
def gather_rows(packed, tail, rows, out):
    """Dequantize rows (T,) of a packed Q8_0 matrix -> out (T, n) f32: a tied token embedding
    read from the output head's packed copy (the file pages under the GGUF copy were released
    after repacking; each new token id would page-fault on them)."""
    group_rows = packed.shape[0] * ROWS_PER_GROUP
    signed = packed.view(np.int8)
    for t in range(rows.shape[0]):
        row = rows[t]
        if row >= group_rows:                     # tail rows stay in GGUF layout
            _dequantize_row(tail[row - group_rows], out[t])
            continue
        g, r = row // ROWS_PER_GROUP, row % ROWS_PER_GROUP
        for b in range(out.shape[1] // 32):
            base = b * GROUP_BLOCK_BYTES
            d = scale_at(packed[g], base + 2 * r)
            for j in range(32):          # chunk j // 8, row r's 8 bytes in it
                at = base + 2 * ROWS_PER_GROUP + 64 * (j // 8) + 8 * r + j % 8
                out[t, b * 32 + j] = d * np.float32(signed[g, at])


@njit(cache=True, inline="always")
def _chunks(w, base):
    """The 4 chunks of the block at w[base], sign bits flipped."""
    return (toggle_bits(load_i8x64(w, base + 16), 0x80), toggle_bits(load_i8x64(w, base + 80), 0x80),
            toggle_bits(load_i8x64(w, base + 144), 0x80), toggle_bits(load_i8x64(w, base + 208), 0x80))


@njit(cache=True, inline="always")      # no refcount per group: common.py, run_serial
def _group(w, xq, offsets, xd, out, t0, col):
    """8 rows (packed Q8_0 group w) x tokens t0..t0+3 -> out[t, col:col+8]."""
    x, o = tile_rows(xq, t0), tile_rows(offsets, t0)
    accs = no_wide_lanes(), no_wide_lanes(), no_wide_lanes(), no_wide_lanes()
    for b in range(xd.shape[1]):
        base = b * GROUP_BLOCK_BYTES
        prefetch_lines(w, base + PREFETCH_BYTES, 5)
        accs = wide_tile_offset(_chunks(w, base), load_halves_as_f32(w, base), x, o, b * 32, tile_column(xd, t0, b),
                                accs)
    store_tile(out, t0, col, tile_results(accs))


@njit(cache=True, inline="always")
def _group_one(w, xq, offsets, xd, out, t, col):
    """8 rows (packed Q8_0 group w) x token t -> out[t, col:col+8]."""
    x, o = xq[t], offsets[t]
    acc = no_wide_lanes()
    for b in range(xd.shape[1]):
        base = b * GROUP_BLOCK_BYTES
        prefetch_lines(w, base + PREFETCH_BYTES, 5)
        acc = wide_block_offset(_chunks(w, base), load_halves_as_f32(w, base), x, o, b * 32, xd[t, b], acc)
    store_f32x8(out[t], col, wide_result(acc))


@njit(cache=True)
def _groups(first, last, packed, acts, outs, part_ends):
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
    xq, offsets, xd = acts
    out = outs[part_ends.shape[0] - 1]
    first = out.shape[1] - tail.shape[0]
    for r in range(tail.shape[0]):
        for t in range(xd.shape[0]):
            out[t, first + r] = row_dot(tail[r], xq[t], xd[t])


@njit(cache=True)
def row_dot(row, xq, xd):
    """One Q8_0 row (nb*34 B) . one token's Q8_0 activations -> float32 (llama.cpp's order)."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
    signed = row.view(np.int8)
    for b in range(xd.shape[0]):
        base = b * 34
        dd = scale_at(row, base) * xd[b]
        q, x = base + 2, b * 32
        a0 = fma(dd, int8s4(signed, q, xq, x), a0)
        a1 = fma(dd, int8s4(signed, q + 4, xq, x + 4), a1)
        a2 = fma(dd, int8s4(signed, q + 8, xq, x + 8), a2)
        a3 = fma(dd, int8s4(signed, q + 12, xq, x + 12), a3)
        a4 = fma(dd, int8s4(signed, q + 16, xq, x + 16), a4)
        a5 = fma(dd, int8s4(signed, q + 20, xq, x + 20), a5)
        a6 = fma(dd, int8s4(signed, q + 24, xq, x + 24), a6)
        a7 = fma(dd, int8s4(signed, q + 28, xq, x + 28), a7)
    return lane_sum(a0, a1, a2, a3, a4, a5, a6, a7)


@njit(cache=True, nogil=True)
def embed_rows(raw, rows, out):
    """Dequantize rows (T,) of a GGUF-layout Q8_0 matrix (vocab, nb*34) -> out (T, n) f32."""
    for t in range(rows.shape[0]):
        _dequantize_row(raw[rows[t]], out[t])


@njit(cache=True, inline="always")
def _dequantize_row(source, out):
    """One GGUF-layout Q8_0 row (n/32*34 B) -> out (n,) f32."""
    values = source.view(np.int8)
    for b in range(out.shape[0] // 32):
        d = scale_at(source, b * 34)
        for j in range(32):
            out[b * 32 + j] = d * np.float32(values[b * 34 + 2 + j])


# ------------------------------------------------------------------ the two entry points

@njit(MATMUL_SIGNATURE, cache=True, nogil=True)
def matmul_serial(packed, tail, part_ends, x, scratch, outs):
    """W Q8_0 packed + tail @ x (T, K) -> outs (kernels/quants/common.py), on this thread."""
    run_serial(_prepare, _groups, _tail, packed, tail, part_ends, x, scratch, outs)


@njit(MATMUL_SIGNATURE, cache=True, parallel=True)
def matmul_parallel(packed, tail, part_ends, x, scratch, outs):
    """The same on numba's thread pool when big enough."""
    run_parallel(_prepare, _groups, _tail, packed, tail, part_ends, x, scratch, outs)
