"""Paged attention and KV writes against a plain NumPy reference over contiguous KV."""
import numpy as np
import pytest

from edge_slm_node.kernels.attention import paged_attention, write_kv

import numba


# The kernel rounds probabilities to fp16 and uses llama.cpp's vector exp; against np.exp a
# last-bit difference can flip one probability's fp16 rounding (relative 2^-11). The exact
# summation orders are checked in test_llama_cpp_numerics.py.
RTOL, ATOL = 1e-3, 3e-4


def reference_attention(q, keys, values, scale):
    """q (heads, d), keys/values (n, kv_heads, d) -> (heads, d); fp16 rounding as the kernel does."""
    heads, kv_heads = q.shape[0], keys.shape[1]
    group = heads // kv_heads
    q16 = q.astype(np.float16).astype(np.float32)
    out = np.zeros_like(q)
    for h in range(heads):
        k = keys[:, h // group].astype(np.float32)
        v = values[:, h // group].astype(np.float32)
        s = (k @ q16[h]) * scale
        p = np.exp(s - s.max())
        p = (p / p.sum()).astype(np.float16).astype(np.float32)
        out[h] = p @ v
    return out


def scratch(group, max_context, head_dim):
    """Per-thread scratch of paged_attention: scores, lanes, row_bits, row_values."""
    threads = numba.config.NUMBA_NUM_THREADS
    return (np.zeros((threads, group, max_context), np.float32), np.zeros((threads, group, 32, head_dim), np.float32),
            np.zeros((threads, head_dim), np.uint32), np.zeros((threads, head_dim), np.float32))


def scatter_blocks(rng, num_positions, block_size, num_blocks):
    """A random (non-contiguous) block table covering num_positions."""
    needed = -(-num_positions // block_size)
    return rng.permutation(num_blocks)[:needed].astype(np.int32)


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("context_lengths", [[1], [5, 17], [16, 33, 64]])
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (4, 4), (8, 1)])
def test_decode_matches_reference(block_size, context_lengths, heads, kv_heads):
    rng = np.random.default_rng(len(context_lengths) * 100 + block_size)
    head_dim, num_blocks = 16, 128
    k_cache = np.zeros((num_blocks, block_size, kv_heads, head_dim), np.uint16)
    v_cache = np.zeros_like(k_cache)
    max_blocks = max(-(-n // block_size) for n in context_lengths)
    tables = np.zeros((len(context_lengths), max_blocks), np.int32)
    keys, values, used = [], [], set()
    for s, n in enumerate(context_lengths):
        free = np.array([b for b in range(num_blocks) if b not in used], np.int32)
        table = rng.permutation(free)[:-(-n // block_size)]
        used.update(table.tolist())
        tables[s, :len(table)] = table
        k = rng.standard_normal((n, kv_heads, head_dim)).astype(np.float16)
        v = rng.standard_normal((n, kv_heads, head_dim)).astype(np.float16)
        for p in range(n):
            k_cache[table[p // block_size], p % block_size] = k[p].view(np.uint16)
            v_cache[table[p // block_size], p % block_size] = v[p].view(np.uint16)
        keys.append(k)
        values.append(v)
    q = rng.standard_normal((len(context_lengths), heads, head_dim)).astype(np.float32)
    expected = [reference_attention(q[s], keys[s], values[s], 0.25) for s in range(len(context_lengths))]
    out = np.zeros_like(q)
    paged_attention(q.copy(), k_cache, v_cache, tables, np.arange(len(context_lengths), dtype=np.int32),
                    np.array(context_lengths, np.int32), np.zeros(len(context_lengths), np.uint8), np.float32(0.25),
                    *scratch(heads // kv_heads, max(context_lengths), head_dim), out)
    for s in range(len(context_lengths)):
        np.testing.assert_allclose(out[s], expected[s], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("cached,new", [(0, 1), (0, 23), (5, 11), (16, 16), (31, 2)])
def test_prefill_is_causal_on_top_of_cached_tokens(block_size, cached, new):
    """Many new tokens of one sequence; token i attends to positions [0, cached + i]."""
    rng = np.random.default_rng(cached * 7 + new)
    heads, kv_heads, head_dim, num_blocks = 6, 2, 8, 32
    total = cached + new
    table = scatter_blocks(rng, total, block_size, num_blocks)[None, :]
    k_cache = np.zeros((num_blocks, block_size, kv_heads, head_dim), np.uint16)
    v_cache = np.zeros_like(k_cache)
    k = rng.standard_normal((total, kv_heads, head_dim)).astype(np.float32)
    v = rng.standard_normal((total, kv_heads, head_dim)).astype(np.float32)
    slots = np.array([table[0, p // block_size] * block_size + p % block_size for p in range(total)], np.int32)
    write_kv(k, v, slots, k_cache, v_cache, np.zeros((total, head_dim), np.uint16))
    np.testing.assert_array_equal(k_cache.reshape(-1, kv_heads, head_dim)[slots], k.astype(np.float16).view(np.uint16))
    q = rng.standard_normal((new, heads, head_dim)).astype(np.float32)
    positions = np.arange(cached, total, dtype=np.int32)
    out = np.zeros_like(q)
    paged_attention(q.copy(), k_cache, v_cache, table, np.zeros(new, np.int32), positions + 1,
                    np.full(new, new > 1, np.uint8), np.float32(0.3), *scratch(heads // kv_heads, total, head_dim), out)
    k16, v16 = k.astype(np.float16), v.astype(np.float16)
    for i, p in enumerate(positions):
        expected = reference_attention(q[i], k16[:p + 1], v16[:p + 1], 0.3)
        np.testing.assert_allclose(out[i], expected, rtol=RTOL, atol=ATOL)
