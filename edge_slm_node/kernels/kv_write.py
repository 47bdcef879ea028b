"""K and V of a batch's tokens into the paged fp16 arena (uint16 bit patterns; numba has no float16)."""
from numba import njit

from . import simd, vec8


@njit(cache=True, inline="always")
def _write_row(source, cache, block, offset, h, row, bits):
    """cache[block, offset, h, :] = fp16 bits of source (head_dim,) f32."""
    head_dim = row.shape[0]
    vector_end = head_dim // 8 * 8 if cache.strides[3] == 2 else 0
    for d in range(head_dim):
        row[d] = source[d]
    at = (block * cache.strides[0] + offset * cache.strides[1] + h * cache.strides[2]) // 2
    for d in range(0, vector_end, 8):
        vec8.store_half(cache, at + d, simd.load_f32x8(row, d))
    for d in range(vector_end, head_dim):
        vec8.store_half(bits, 0, simd.splat_f32(row[d]))
        cache[block, offset, h, d] = bits[0]


@njit(cache=True, nogil=True)
def write_kv(k, v, slot_mapping, k_cache, v_cache, row, bits):
    """k, v (T, kv_heads, head_dim) f32 -> cache slots slot_mapping (T,) as fp16 (round to nearest
    even, as half.float_to_half_bits). Scratch: row f32 (head_dim,), bits u16 (8,)."""
    num_tokens, kv_heads, head_dim = k.shape
    block_size = k_cache.shape[1]
    for t in range(num_tokens):
        slot = slot_mapping[t]
        block, offset = slot // block_size, slot % block_size
        for h in range(kv_heads):
            _write_row(k[t, h], k_cache, block, offset, h, row, bits)
            _write_row(v[t, h], v_cache, block, offset, h, row, bits)
