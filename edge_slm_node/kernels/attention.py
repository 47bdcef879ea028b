"""Paged attention over one fp16 KV arena (uint16 bit patterns; numba has no float16).

Per layer the cache is k_cache, v_cache (num_blocks, block_size, kv_heads, head_dim).
A token's position p lives in block block_table[p // block_size] at offset p % block_size.
Numerics follow llama.cpp's non-flash path: q rounded to fp16, scores and softmax in f32,
probabilities rounded to fp16 before they weight V.
"""
import numba
import numpy as np
from numba import njit, prange

from .half import float_to_half_bits, half_bits_to_float, round_to_half


@njit(parallel=True, cache=True)
def write_kv(k, v, slot_mapping, k_cache, v_cache, scratch_bits):
    """k, v (T, kv_heads, head_dim) f32 -> cache slots slot_mapping (T,) as fp16; scratch_bits (T, head_dim) u16."""
    num_tokens, kv_heads, head_dim = k.shape
    block_size = k_cache.shape[1]
    for t in prange(num_tokens):
        slot = slot_mapping[t]
        block, offset = slot // block_size, slot % block_size
        for h in range(kv_heads):
            float_to_half_bits(k[t, h], scratch_bits[t])
            k_cache[block, offset, h, :] = scratch_bits[t]
            float_to_half_bits(v[t, h], scratch_bits[t])
            v_cache[block, offset, h, :] = scratch_bits[t]


@njit(parallel=True, cache=True)
def paged_attention(q, k_cache, v_cache, block_tables, token_seq, token_context, scale,
                    scores, row_bits, row_values, out):
    """q (T, heads, head_dim) f32; token t attends to positions [0, token_context[t]) of sequence
    token_seq[t] via block_tables (S, max_blocks) -> out (T, heads, head_dim) f32.
    Scratch per thread: scores (threads, group, max_context), row_bits u32 / row_values f32 (threads, head_dim).
    """
    num_tokens, num_heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // kv_heads
    for item in prange(num_tokens * kv_heads):
        t, kv_head = item // kv_heads, item % kv_heads
        thread = numba.get_thread_id()
        seq = token_seq[t]
        context = token_context[t]
        table = block_tables[seq]
        bits = row_bits[thread]
        values = row_values[thread]
        score = scores[thread]
        for g in range(group):
            h = kv_head * group + g
            for d in range(head_dim):
                q[t, h, d] = round_to_half(q[t, h, d])
        for p in range(context):
            block, offset = table[p // block_size], p % block_size
            half_bits_to_float(k_cache[block, offset, kv_head], bits, values)
            for g in range(group):
                h = kv_head * group + g
                dot = np.float32(0.0)
                for d in range(head_dim):
                    dot += q[t, h, d] * values[d]
                score[g, p] = dot * scale
        for g in range(group):
            h = kv_head * group + g
            peak = np.float32(-np.inf)
            for p in range(context):
                peak = max(peak, score[g, p])
            total = 0.0
            for p in range(context):
                e = np.float32(np.exp(score[g, p] - peak))
                score[g, p] = e
                total += e
            inverse = np.float32(1.0 / total)
            for p in range(context):
                score[g, p] = round_to_half(score[g, p] * inverse)
            for d in range(head_dim):
                out[t, h, d] = 0.0
        for p in range(context):
            block, offset = table[p // block_size], p % block_size
            half_bits_to_float(v_cache[block, offset, kv_head], bits, values)
            for g in range(group):
                h = kv_head * group + g
                weight = score[g, p]
                for d in range(head_dim):
                    out[t, h, d] += weight * values[d]
