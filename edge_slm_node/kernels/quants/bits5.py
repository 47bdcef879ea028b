"""What Q5_0 and Q5_1 share: the 5th bits of 32 weights (GGUF: a little-endian uint32 qh, bit j
for weight j; 4-bit parts as Q4_0's nibble bytes) and their packed form.

Packed layout of a group of 8 rows, per block (scale_bytes = 2 for Q5_0's d, 4 for Q5_1's d, m):
    scales (each fp16 scale of the 8 rows side by side) | fifth bits, 32 B | 2 chunks k of 64 B
Chunk k holds row r's nibble bytes 8k..8k+7 at 8r (weight 8k+i in the low nibble of byte i,
16+8k+i in the high one), as Q4_1's packed layout (kernels/quants/q4_1.py): each 4-byte word is
one of the 4-weight groups llama.cpp's AVX2 dot products sum into one float lane. Byte 4r+e of
the fifth bits holds, at bit 2k+h, the 5th bit of weight 16h+8k+e of row r and, at bit 4+2k+h,
that of weight 16h+8k+4+e: fifth_bit_bytes spreads them over the 64 bytes of a chunk, after which
fifth_bits(those, 2k+h) lines chunk k's low (h = 0) or high (h = 1) nibbles' bits up. The same
8 * type_size bytes as stored.
"""
import numpy as np
from numba import njit

from ..simd_int import bits_or, high_nibbles, interleave_words, load_i8x32, load_i8x64, low_nibbles, mask_bits, \
    shift_left, shift_right
from .common import ROWS_PER_GROUP


@njit(cache=True, inline="always")
def fifth_bits(bits, k):
    """Bit k of each byte of an I8x32 or I8x64 moved to bit 4 (the 16s of a 5-bit weight), other bits 0."""
    return mask_bits(shift_right(bits, k - 4) if k >= 4 else shift_left(bits, 4 - k), 16)


@njit(cache=True, inline="always")
def fifth_bit_bytes(w, at):
    """The 32 fifth-bit bytes at w[at] -> I8x64 lined up with a chunk's bytes: byte 8r+i holds,
    at bit 2k+h, the 5th bit of weight 16h+8k+i of row r."""
    bits = load_i8x32(w, at)
    return interleave_words(bits, shift_right(bits, 4))


@njit(cache=True, inline="always")
def five_bit_vectors(w, bits_at, chunks_at):
    """The packed block's 4 vectors of 5-bit weights (0..31) for kernels/quants/lanes.py's
    wide_block: chunk 0's and 1's low nibbles, then their high ones, each with its 5th bits."""
    fifth = fifth_bit_bytes(w, bits_at)
    q0, q1 = load_i8x64(w, chunks_at), load_i8x64(w, chunks_at + 64)
    return (bits_or(low_nibbles(q0), fifth_bits(fifth, 0)), bits_or(low_nibbles(q1), fifth_bits(fifth, 2)),
            bits_or(high_nibbles(q0), fifth_bits(fifth, 1)), bits_or(high_nibbles(q1), fifth_bits(fifth, 3)))


@njit(cache=True)
def pack_groups5(raw, packed, type_size, scale_bytes):
    """GGUF Q5_0 / Q5_1 rows raw (groups*8.., nb*type_size) -> packed (groups, nb*8*type_size)."""
    rows = ROWS_PER_GROUP
    bits_at = scale_bytes * rows
    chunks_at = bits_at + 32
    for g in range(packed.shape[0]):
        for r in range(rows):
            source = raw[g * rows + r]
            for b in range(raw.shape[1] // type_size):
                src, dst = b * type_size, b * rows * type_size
                for s in range(scale_bytes // 2):
                    packed[g, dst + 2 * rows * s + 2 * r] = source[src + 2 * s]
                    packed[g, dst + 2 * rows * s + 2 * r + 1] = source[src + 2 * s + 1]
                qh = np.uint32(0)
                for i in range(4):
                    qh |= np.uint32(source[src + scale_bytes + i]) << np.uint32(8 * i)
                for e in range(4):
                    byte = np.uint32(0)
                    for k in range(2):
                        for h in range(2):
                            for half in range(2):
                                weight = 16 * h + 8 * k + 4 * half + e
                                byte |= ((qh >> np.uint32(weight)) & np.uint32(1)) << np.uint32(4 * half + 2 * k + h)
                    packed[g, dst + bits_at + 4 * r + e] = np.uint8(byte)
                for k in range(2):
                    for i in range(8):
                        packed[g, dst + chunks_at + 64 * k + 8 * r + i] = source[src + scale_bytes + 4 + 8 * k + i]


def repack5(raw: np.ndarray, type_size: int, scale_bytes: int) -> tuple:
    """GGUF rows (rows, nb*type_size) -> (packed (rows//8, nb*8*type_size), tail (rows%8, ·) as stored)."""
    groups = raw.shape[0] // ROWS_PER_GROUP
    packed = np.empty((groups, raw.shape[1] * ROWS_PER_GROUP), np.uint8)
    pack_groups5(raw, packed, type_size, scale_bytes)
    return packed, np.array(raw[groups * ROWS_PER_GROUP:], dtype=np.uint8, order="C")


def five_bit_values(blocks: np.ndarray, scale_bytes: int) -> np.ndarray:
    """GGUF Q5_0 / Q5_1 blocks (n, ·) -> the unsigned 5-bit values (n, 32) as float32."""
    qh = blocks[:, scale_bytes:scale_bytes + 4].copy().view(np.uint32)
    high = (qh >> np.arange(32, dtype=np.uint32)) & 1
    qs = blocks[:, scale_bytes + 4:scale_bytes + 20]
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.uint32)
    return (low | (high << 4)).astype(np.float32)


@njit(cache=True, inline="always")
def fifth_bit(row, at, j):
    """The 5th bit of weight j of the GGUF block whose qh starts at row[at] (0 or 16)."""
    return np.int32((row[at + j // 8] >> (j % 8)) & 1) << 4
