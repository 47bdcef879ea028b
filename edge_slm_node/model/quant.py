"""GGML quantization types this engine reads, and NumPy reference dequantizers.

Block layouts (little endian, one block = `block_size` weights in `type_size` bytes):
  F32   4-byte floats                      Q8_0  f16 d, int8 q[32]          w = d*q
  F16   2-byte halves                      Q4_0  f16 d, u8 nibbles[16]      w = d*(q-8)
                                           Q4_1  f16 d, f16 m, u8 nibbles[16]  w = d*q + m
Nibble order: byte j holds weight j in its low nibble and weight j+16 in its high nibble.
The dequantizers are references for tests and for one-row lookups; the hot path works
on the packed bytes directly (kernels/matvec.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class QuantType:
    name: str
    type_id: int          # ggml_type value stored in the GGUF tensor directory
    block_size: int       # weights per block
    type_size: int        # bytes per block


F32 = QuantType("F32", 0, 1, 4)
F16 = QuantType("F16", 1, 1, 2)
Q4_0 = QuantType("Q4_0", 2, 32, 18)
Q4_1 = QuantType("Q4_1", 3, 32, 20)
Q8_0 = QuantType("Q8_0", 8, 32, 34)

QUANT_TYPES = {q.type_id: q for q in (F32, F16, Q4_0, Q4_1, Q8_0)}


def _halves(blocks: np.ndarray, start: int) -> np.ndarray:
    return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    low = packed & 0x0F
    high = packed >> 4
    return np.concatenate([low, high], axis=1).astype(np.float32)


def dequantize(raw: np.ndarray, quant: QuantType) -> np.ndarray:
    """Raw bytes (rows, bytes_per_row) -> float32 (rows, row_length)."""
    rows = raw.shape[0]
    if quant is F32:
        return raw.copy().view(np.float32).reshape(rows, -1)
    if quant is F16:
        return raw.copy().view(np.float16).astype(np.float32).reshape(rows, -1)
    blocks = raw.reshape(-1, quant.type_size)
    if quant is Q8_0:
        values = _halves(blocks, 0) * blocks[:, 2:].view(np.int8).astype(np.float32)
    elif quant is Q4_0:
        values = _halves(blocks, 0) * (_nibbles(blocks[:, 2:]) - 8.0)
    elif quant is Q4_1:
        values = _halves(blocks, 0) * _nibbles(blocks[:, 4:]) + _halves(blocks, 2)
    else:
        raise ValueError(f"no dequantizer for {quant.name}")
    return values.reshape(rows, -1)


def quantize(weights: np.ndarray, quant: QuantType) -> np.ndarray:
    """float32 (rows, row_length) -> raw bytes (rows, bytes_per_row); for writing test models."""
    rows, length = weights.shape
    if quant is F32:
        return weights.astype(np.float32).view(np.uint8).reshape(rows, -1)
    if quant is F16:
        return weights.astype(np.float16).view(np.uint8).reshape(rows, -1)
    blocks = weights.astype(np.float32).reshape(-1, 32)
    if quant is Q8_0:
        amax = np.abs(blocks).max(axis=1, keepdims=True)
        scale = amax / 127.0
        inverse = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
        q = np.round(blocks * inverse).astype(np.int8)
        out = np.concatenate([scale.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=1)
    elif quant is Q4_0:
        index = np.abs(blocks).argmax(axis=1)
        signed_max = blocks[np.arange(len(blocks)), index][:, None]
        scale = signed_max / -8.0
        inverse = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale != 0)
        q = np.clip(np.floor(blocks * inverse + 8.5), 0, 15).astype(np.uint8)
        packed = q[:, :16] | (q[:, 16:] << 4)
        out = np.concatenate([scale.astype(np.float16).view(np.uint8), packed], axis=1)
    elif quant is Q4_1:
        low = blocks.min(axis=1, keepdims=True)
        high = blocks.max(axis=1, keepdims=True)
        scale = (high - low) / 15.0
        inverse = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
        q = np.clip(np.round((blocks - low) * inverse), 0, 15).astype(np.uint8)
        packed = q[:, :16] | (q[:, 16:] << 4)
        out = np.concatenate([scale.astype(np.float16).view(np.uint8),
                              low.astype(np.float16).view(np.uint8), packed], axis=1)
    else:
        raise ValueError(f"no quantizer for {quant.name}")
    return np.ascontiguousarray(out).reshape(rows, -1)
