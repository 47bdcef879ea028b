"""Row-interleaved weight layouts for the quantized matmuls (the SIMD primitives reading them
are in kernels/simd.py).

Rows are repacked at load time in groups of ROWS_PER_GROUP = 8 so that one 32-byte load holds
the same weights of 8 rows and a block's integer dot products land in vectors of 8 int32
(one lane per row): no horizontal sums, no per-block scale inside the inner loop. Every
byte of the GGUF blocks is kept (scales stay fp16), so the packed form is exactly as large
as the stored one. Layout of group g (rows 8g..8g+7), one entry per 32-weight block b:

  Q4_1  160 B: d[8] f16 | m[8] f16 | 4 chunks c of 32 B: row r's GGUF nibble bytes 4c..4c+3
  Q4_0  144 B: d[8] f16 |            4 chunks as Q4_1
  Q8_0  272 B: d[8] f16 | 16 chunks c of 16 B: row r's int8 weights 2c, 2c+1

(chunk bytes are ordered row-major: row 0's bytes, then row 1's, ...). A nibble byte holds
weight j in its low and weight j+16 in its high nibble, as in GGUF, so Q4_1/Q4_0 chunk c holds
weights 4c..4c+3 (low nibbles) and 16+4c..16+4c+3 (high nibbles) of each row, and Q8_0 chunks
2l, 2l+1 hold weights 4l..4l+3: exactly the 4-weight groups llama.cpp's AVX2 dot products sum
into one float lane (see kernels/matmul.py). Rows after the last full group ("tail",
rows % 8 of them) stay in GGUF layout and are handled by scalar code.
Note: numba's cache does not notice edits to this file or to ops.dequantize_row_q8_0 (inlined);
clear __pycache__ after changing them.
"""
import numpy as np
from numba import njit

from ..model.quant import Q4_0, Q4_1, Q8_0, QuantType
from .ops import dequantize_row_q8_0

ROWS_PER_GROUP = 8
_HALF_BYTES = 2 * ROWS_PER_GROUP                      # d (or m) of the 8 rows of a block
GROUP_BLOCK_BYTES = {Q4_1.name: 160, Q4_0.name: 144, Q8_0.name: 272}
GROUP_BLOCK_BYTES_Q8_0 = GROUP_BLOCK_BYTES[Q8_0.name]


# ----------------------------------------------------------------------------------- repacking

def split_rows(raw: np.ndarray) -> tuple[int, int]:
    """(rows, bytes_per_row) -> (number of full groups, number of tail rows)."""
    return raw.shape[0] // ROWS_PER_GROUP, raw.shape[0] % ROWS_PER_GROUP


_LAYOUT = {Q4_1.name: (4, 4), Q4_0.name: (2, 4), Q8_0.name: (2, 2)}   # (scale bytes, chunk bytes) per row


def repack(raw: np.ndarray, quant: QuantType) -> tuple[np.ndarray, np.ndarray]:
    """GGUF bytes (rows, nb*type_size) -> packed (groups, nb*group_block_bytes) u8, tail (rows%8, nb*type_size) u8."""
    if quant.name not in _LAYOUT:
        raise ValueError(f"no packed layout for {quant.name}")
    blocks = raw.shape[1] // quant.type_size
    groups, _ = split_rows(raw)
    packed = np.empty((groups, blocks * GROUP_BLOCK_BYTES[quant.name]), np.uint8)
    scale_bytes, chunk_bytes = _LAYOUT[quant.name]
    _pack(raw, packed, quant.type_size, scale_bytes, chunk_bytes)
    tail = np.array(raw[groups * ROWS_PER_GROUP:], dtype=np.uint8, order="C")
    return packed, tail


@njit(cache=True)
def _pack(raw, packed, type_size, scale_bytes, chunk_bytes):
    """Fill packed (groups, nb*8*type_size) from raw's first groups*8 rows; see the layout above."""
    rows = ROWS_PER_GROUP
    payload_start = scale_bytes // 2 * _HALF_BYTES
    for g in range(packed.shape[0]):
        for r in range(rows):
            source = raw[g * rows + r]
            for b in range(raw.shape[1] // type_size):
                src = b * type_size
                dst = b * rows * type_size
                for s in range(scale_bytes // 2):
                    packed[g, dst + s * _HALF_BYTES + 2 * r] = source[src + 2 * s]
                    packed[g, dst + s * _HALF_BYTES + 2 * r + 1] = source[src + 2 * s + 1]
                for c in range((type_size - scale_bytes) // chunk_bytes):
                    at = dst + payload_start + c * rows * chunk_bytes + r * chunk_bytes
                    for k in range(chunk_bytes):
                        packed[g, at + k] = source[src + scale_bytes + c * chunk_bytes + k]


@njit(cache=True, nogil=True)
def gather_rows_q8_0(packed, tail, rows, half_to_float, out):
    """Dequantize rows (T,) of a repacked Q8_0 matrix (packed, tail as from repack) -> out (T, n) f32.

    Lets a tied token embedding read the output head's packed copy instead of the file pages
    the repack released (each new token id would page-fault on them)."""
    group_rows = packed.shape[0] * ROWS_PER_GROUP
    signed = packed.view(np.int8)
    for t in range(rows.shape[0]):
        row = rows[t]
        if row >= group_rows:                     # tail rows stay in GGUF layout
            dequantize_row_q8_0(tail[row - group_rows], half_to_float, out[t])
            continue
        g, r = row // ROWS_PER_GROUP, row % ROWS_PER_GROUP
        for b in range(out.shape[1] // 32):
            base = b * GROUP_BLOCK_BYTES_Q8_0
            d = half_to_float[np.int64(packed[g, base + 2 * r]) | (np.int64(packed[g, base + 2 * r + 1]) << 8)]
            for c in range(16):
                at = base + _HALF_BYTES + c * 16 + 2 * r
                out[t, b * 32 + 2 * c] = d * np.float32(signed[g, at])
                out[t, b * 32 + 2 * c + 1] = d * np.float32(signed[g, at + 1])


def unpack(packed: np.ndarray, tail: np.ndarray, quant: QuantType) -> np.ndarray:
    """Inverse of repack (for tests): -> GGUF bytes (rows, nb*type_size)."""
    groups, rows = packed.shape[0], ROWS_PER_GROUP
    block_bytes = GROUP_BLOCK_BYTES[quant.name]
    blocks = packed.shape[1] // block_bytes
    scale_bytes = (2 if quant is Q4_1 else 1) * _HALF_BYTES
    chunk_bytes = 2 if quant is Q8_0 else 4
    p = packed.reshape(groups, blocks, block_bytes)
    head = p[..., :scale_bytes].reshape(groups, blocks, scale_bytes // _HALF_BYTES, rows, 2).transpose(0, 1, 3, 2, 4)
    payload = p[..., scale_bytes:].reshape(groups, blocks, (block_bytes - scale_bytes) // (rows * chunk_bytes), rows,
                                           chunk_bytes).transpose(0, 1, 3, 2, 4)
    block = np.concatenate([head.reshape(groups, blocks, rows, scale_bytes // rows),
                            payload.reshape(groups, blocks, rows, (block_bytes - scale_bytes) // rows)], axis=3)
    out = block.transpose(0, 2, 1, 3).reshape(groups * rows, blocks * quant.type_size)
    return np.concatenate([out, tail], axis=0)
