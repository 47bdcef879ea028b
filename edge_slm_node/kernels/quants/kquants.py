"""What the K-quants (Q4_K, Q5_K, Q6_K: super-blocks of 256 weights) share: their Q8_K
activations, the 6-bit scales and mins of Q4_K / Q5_K, and the pieces of their packed layouts.

Packed layouts keep every stored byte (8 rows x type_size per super-block, nothing added):
fp16 fields of the 8 rows side by side (16 B each), scale bytes transposed (byte k of row r at
8k + r: one 8-byte load gives a scale of all 8 rows, one per vector lane), then the quants in
chunks of 32 B holding 4 consecutive GGUF bytes of each row (row r at 4r): one pmaddubsw on a
chunk and 4 broadcast activations gives 8 rows' 4-weight sums, the units llama.cpp's AVX2 dot
products add up. Activations: Q8_K (kernels/quantize.py) in the q8 / scales / isums slots.
"""
import numpy as np
from numba import njit

from ..quantize import SUPER_BLOCK, quantize_rows_q8_k
from ..simd_int import bits_or, load_u8x8_as_i32, mask_bits, shift_left, shift_right
from .common import ROWS_PER_GROUP, rows_of

SCRATCH_SLOTS = ("q8", "scales", "isums")


@njit(cache=True, inline="always")
def prepare_q8_k(x, scratch):
    """x (T, K) -> (xq (T, K) int8, xd (T, K/256) f32, bsums (T, K/16) int32, call_index (T,),
    call_length (T,)) views of scratch (the last two as set by the caller: common.py)."""
    num_tokens, length = x.shape
    xq = rows_of(scratch.q8, num_tokens, length)
    xd = rows_of(scratch.scales, num_tokens, length // SUPER_BLOCK)
    bsums = rows_of(scratch.isums, num_tokens, length // 16)
    quantize_rows_q8_k(x, xq, xd, bsums)
    return xq, xd, bsums, scratch.call_index[:num_tokens], scratch.call_length[:num_tokens]


@njit(cache=True, inline="always")
def in_gemm_tile(call_index, call_length, t):
    """Whether llama.cpp's repacked Q4_K matmul runs token t in a 4-token gemm tile: it is among
    the first L - L % 4 tokens of its call of L."""
    length = call_length[t]
    return call_index[t] < length - length % 4


@njit(cache=True, inline="always")
def in_tiled_call(call_length, t, min_tokens):
    """Whether llama.cpp's tiled K-quant matmul takes token t: its call has >= min_tokens tokens."""
    return call_length[t] >= min_tokens


@njit(cache=True, inline="always")
def hold(count, t0, t1, t2, t):
    """Token t joins up to 2 tokens held for a 4-token tile -> (count + 1, t0, t1, t2)."""
    if count == 0:
        return 1, t, t1, t2
    if count == 1:
        return 2, t0, t, t2
    return 3, t0, t1, t


@njit(cache=True, inline="always")
def held(k, t0, t1, t2):
    """The k-th (0..2) held token."""
    return t0 if k == 0 else (t1 if k == 1 else t2)


# --------------------------------------------- Q4_K / Q5_K scales and mins: 12 bytes, 8 x 2 x 6 bits

def scales_and_mins(scales: np.ndarray) -> tuple:
    """NumPy: the 12 scale bytes of n super-blocks (n, 12) -> (sc, m), each (n, 8) float32."""
    q = scales.astype(np.int32)
    low = np.concatenate([q[:, 0:4] & 63, (q[:, 8:12] & 15) | ((q[:, 0:4] >> 6) << 4)], axis=1)
    mins = np.concatenate([q[:, 4:8] & 63, (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)], axis=1)
    return low.astype(np.float32), mins.astype(np.float32)


@njit(cache=True, inline="always")
def scale_min(row, at, s):
    """(scale, min) of sub-block s (0..7) from the 12 scale bytes at row[at] (ggml's get_scale_min_k4)."""
    if s < 4:
        return np.int32(row[at + s]) & 63, np.int32(row[at + s + 4]) & 63
    high = np.int32(row[at + s + 4])
    return (high & 15) | ((np.int32(row[at + s - 4]) >> 6) << 4), (high >> 4) | ((np.int32(row[at + s]) >> 6) << 4)


@njit(cache=True, inline="always")
def scale_min_rows(w, at, s):
    """(scale, min) of sub-block s for 8 rows, I32x8 each, from transposed scale bytes at w[at]."""
    if s < 4:
        return mask_bits(load_u8x8_as_i32(w, at + 8 * s), 63), mask_bits(load_u8x8_as_i32(w, at + 8 * (s + 4)), 63)
    high = load_u8x8_as_i32(w, at + 8 * (s + 4))
    scale = bits_or(mask_bits(high, 15), shift_left(shift_right(load_u8x8_as_i32(w, at + 8 * (s - 4)), 6), 4))
    minimum = bits_or(shift_right(high, 4), shift_left(shift_right(load_u8x8_as_i32(w, at + 8 * s), 6), 4))
    return scale, minimum


@njit(cache=True, inline="always")
def pair_sum(bsums, at):
    """bsums[at] + bsums[at + 1]: the sum of 32 activation quants (one Q4_K / Q5_K sub-block)."""
    return bsums[at] + bsums[at + 1]


# ------------------------------------------------------------------------- packing pieces

@njit(cache=True, inline="always")
def put_halves(source, src, packed_row, dst, r):
    """The fp16 at source[src] -> row r's slot of 8 fp16 side by side at packed_row[dst]."""
    packed_row[dst + 2 * r] = source[src]
    packed_row[dst + 2 * r + 1] = source[src + 1]


@njit(cache=True, inline="always")
def put_transposed(source, src, count, packed_row, dst, r):
    """count bytes source[src..] -> byte k at packed_row[dst + 8k + r]."""
    for k in range(count):
        packed_row[dst + ROWS_PER_GROUP * k + r] = source[src + k]


@njit(cache=True, inline="always")
def put_chunk(source, src, packed_row, dst, r):
    """4 bytes source[src..src+3] -> row r's 4 bytes of the 32-byte chunk at packed_row[dst]."""
    for e in range(4):
        packed_row[dst + 4 * r + e] = source[src + e]


def repack_k(raw: np.ndarray, pack_groups) -> tuple:
    """GGUF rows (rows, nb*type_size) -> (packed (rows//8, nb*8*type_size) by pack_groups(raw,
    packed), tail (rows % 8, ·) as stored): the same bytes, so no larger than the stored form."""
    groups = raw.shape[0] // ROWS_PER_GROUP
    packed = np.empty((groups, raw.shape[1] * ROWS_PER_GROUP), np.uint8)
    pack_groups(raw, packed)
    return packed, np.array(raw[groups * ROWS_PER_GROUP:], dtype=np.uint8, order="C")
