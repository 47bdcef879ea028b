"""Paged attention over one fp16 KV arena (uint16 bit patterns; numba has no float16).

Per layer the cache is k_cache, v_cache (num_blocks, block_size, kv_heads, head_dim).
A token's position p lives in block block_table[p // block_size] at offset p % block_size.

Numerics are those of llama.cpp's CPU path without flash attention (x86 AVX2 build): q and the
probabilities are rounded to fp16 (they are converted for the F16 x F16 matmuls), scores and
softmax in float32 with its vector exp (ops.exp_f32), the softmax sum in float64 over 8-wide
groups. Every product of two fp16 values is exact in float32, so only the order of the sums
matters, and llama.cpp uses two orders:

- one token per llama_decode (decode): ggml_vec_dot_f16, 32 lanes (4 vectors x 8), lane
  i sums elements i, i+32, i+64, ...; then vectors (1+3)+(0+2), halves, pairs
  (`_reduce_32`; elements past the last multiple of 32 are added in float64 afterwards).
- two or more tokens in one batch (prompt): llamafile's tinyBLAS F16 gemm, 8 lanes, lane i
  sums elements i, i+8, ...; then hsum_float_8 (`ops.hsum8`). It is used when the dot length
  is a multiple of 8 (and, for V, head_dim a multiple of 4); otherwise ggml falls back to
  the decode order.

`batched[t]` (T,) selects the prompt order for token t. The dot over positions (probabilities
. V) runs over llama.cpp's padded KV length; positions past the context hold zero
probability, which leaves every lane sum unchanged, so only [0, context) is visited.
"""
import numba
import numpy as np
from numba import njit, prange

from .half import float_to_half_bits, half_bits_to_float, round_to_half
from .ops import exp_f32, hsum8

DECODE_LANES = 32
PROMPT_LANES = 8


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


@njit(cache=True, inline="always")
def _reduce_32(lanes, at):
    """Sum of lanes[at:at+32] in ggml_vec_dot_f16's order (lane 8*j + i = vector j, element i)."""
    v0 = (lanes[at + 8] + lanes[at + 24]) + (lanes[at] + lanes[at + 16])
    v1 = (lanes[at + 9] + lanes[at + 25]) + (lanes[at + 1] + lanes[at + 17])
    v2 = (lanes[at + 10] + lanes[at + 26]) + (lanes[at + 2] + lanes[at + 18])
    v3 = (lanes[at + 11] + lanes[at + 27]) + (lanes[at + 3] + lanes[at + 19])
    v4 = (lanes[at + 12] + lanes[at + 28]) + (lanes[at + 4] + lanes[at + 20])
    v5 = (lanes[at + 13] + lanes[at + 29]) + (lanes[at + 5] + lanes[at + 21])
    v6 = (lanes[at + 14] + lanes[at + 30]) + (lanes[at + 6] + lanes[at + 22])
    v7 = (lanes[at + 15] + lanes[at + 31]) + (lanes[at + 7] + lanes[at + 23])
    t0, t1, t2, t3 = v4 + v0, v5 + v1, v6 + v2, v7 + v3
    return (t0 + t1) + (t2 + t3)


@njit(cache=True, inline="always")
def _dot_f16(a, b, prompt_order, lanes):
    """a . b for fp16-valued float32 vectors of one length, in llama.cpp's order; lanes: 32 f32 scratch."""
    n = a.shape[0]
    if prompt_order:
        for i in range(PROMPT_LANES):
            lanes[i] = a[i] * b[i]
        for s in range(PROMPT_LANES, n, PROMPT_LANES):
            for i in range(PROMPT_LANES):
                lanes[i] += a[s + i] * b[s + i]
        return hsum8(lanes, 0)
    vector_end = n // DECODE_LANES * DECODE_LANES
    total = 0.0
    if vector_end > 0:
        for i in range(DECODE_LANES):
            lanes[i] = a[i] * b[i]
        for s in range(DECODE_LANES, vector_end, DECODE_LANES):
            for i in range(DECODE_LANES):
                lanes[i] += a[s + i] * b[s + i]
        total = np.float64(_reduce_32(lanes, 0))
    for i in range(vector_end, n):                  # ggml adds the rest in float64
        total += np.float64(a[i] * b[i])
    return np.float32(total)


@njit(parallel=True, cache=True)
def paged_attention(q, k_cache, v_cache, block_tables, token_seq, token_context, batched, scale,
                    scores, lanes, row_bits, row_values, out):
    """q (T, heads, head_dim) f32; token t attends to positions [0, token_context[t]) of sequence
    token_seq[t] via block_tables (S, max_blocks), in prompt order if batched[t] (T,) is nonzero
    -> out (T, heads, head_dim) f32. q is rounded to fp16 in place.
    Scratch per thread: scores (threads, group, max_context), lanes (threads, group, 32, head_dim),
    row_bits u32 / row_values f32 (threads, head_dim).
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
        acc = lanes[thread]
        small = np.empty(DECODE_LANES, np.float32)
        qk_prompt = batched[t] != 0 and head_dim % PROMPT_LANES == 0
        pv_prompt = batched[t] != 0 and head_dim % 4 == 0
        num_lanes = PROMPT_LANES if pv_prompt else DECODE_LANES
        lane_mask = num_lanes - 1
        for g in range(group):
            h = kv_head * group + g
            for d in range(head_dim):
                q[t, h, d] = round_to_half(q[t, h, d])
        # scores = (K . q) * scale
        for p in range(context):
            block, offset = table[p // block_size], p % block_size
            half_bits_to_float(k_cache[block, offset, kv_head], bits, values)
            for g in range(group):
                h = kv_head * group + g
                score[g, p] = _dot_f16(values, q[t, h], qk_prompt, small) * scale
        # softmax: vector exp, float32 sums of 8 aligned positions accumulated in float64
        for g in range(group):
            peak = np.float32(-np.inf)
            for p in range(context):
                peak = max(peak, score[g, p])
            total = 0.0
            full = context // 8 * 8
            for start in range(0, full, 8):
                for i in range(8):
                    score[g, start + i] = exp_f32(score[g, start + i] - peak)
                total += np.float64(hsum8(score[g], start))
            if full < context:                   # last group: positions past the context are 0
                for i in range(8):
                    small[i] = 0.0
                for i in range(context - full):
                    small[i] = exp_f32(score[g, full + i] - peak)
                    score[g, full + i] = small[i]
                total += np.float64(hsum8(small, 0))
            inverse = np.float32(1.0 / total)
            for p in range(context):
                score[g, p] = round_to_half(score[g, p] * inverse)
            for i in range(num_lanes):
                for d in range(head_dim):
                    acc[g, i, d] = 0.0
        # out = P . V: lane p % num_lanes of each output element sums its positions in order
        for p in range(context):
            block, offset = table[p // block_size], p % block_size
            half_bits_to_float(v_cache[block, offset, kv_head], bits, values)
            lane = p & lane_mask
            for g in range(group):
                weight = score[g, p]
                row = acc[g, lane]
                for d in range(head_dim):
                    row[d] += weight * values[d]
        for g in range(group):
            h = kv_head * group + g
            for d in range(head_dim):
                if pv_prompt:
                    a0 = acc[g, 4, d] + acc[g, 0, d]
                    a1 = acc[g, 5, d] + acc[g, 1, d]
                    a2 = acc[g, 6, d] + acc[g, 2, d]
                    a3 = acc[g, 7, d] + acc[g, 3, d]
                    out[t, h, d] = (a0 + a2) + (a1 + a3)
                else:
                    out[t, h, d] = _reduce_32(acc[g, :, d], 0)
