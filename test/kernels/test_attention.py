"""Paged attention and KV writes against a plain NumPy reference over contiguous KV."""
import os
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest
from numba import njit, prange

from edge_slm_node.kernels.attention import attention_work, paged_attention, paged_attention_serial
from edge_slm_node.kernels.kv_write import write_kv
from edge_slm_node.kernels.half import float_to_half_bits, half_bits_to_float, round_to_half
from edge_slm_node.kernels.ops import exp_f32, hsum8

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
                    out)
    for s in range(len(context_lengths)):
        np.testing.assert_allclose(out[s], expected[s], rtol=RTOL, atol=ATOL)


def cached_sequence(rng, total, block_size, num_blocks, kv_heads, head_dim):
    """One sequence's random K/V for `total` positions written through a scattered block table;
    -> (table (1, blocks), k_cache, v_cache, k, v, slots)."""
    table = scatter_blocks(rng, total, block_size, num_blocks)[None, :]
    k_cache = np.zeros((num_blocks, block_size, kv_heads, head_dim), np.uint16)
    v_cache = np.zeros_like(k_cache)
    k = rng.standard_normal((total, kv_heads, head_dim)).astype(np.float32)
    v = rng.standard_normal((total, kv_heads, head_dim)).astype(np.float32)
    slots = np.array([table[0, p // block_size] * block_size + p % block_size for p in range(total)], np.int32)
    write_kv(k, v, slots, k_cache, v_cache, np.zeros(head_dim, np.float32), np.zeros(8, np.uint16))
    return table, k_cache, v_cache, k, v, slots


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("cached,new", [(0, 1), (0, 23), (5, 11), (16, 16), (31, 2)])
def test_prefill_is_causal_on_top_of_cached_tokens(block_size, cached, new):
    """Many new tokens of one sequence; token i attends to positions [0, cached + i]."""
    rng = np.random.default_rng(cached * 7 + new)
    heads, kv_heads, head_dim, num_blocks = 6, 2, 8, 32
    total = cached + new
    table, k_cache, v_cache, k, v, slots = cached_sequence(rng, total, block_size, num_blocks, kv_heads, head_dim)
    np.testing.assert_array_equal(k_cache.reshape(-1, kv_heads, head_dim)[slots], k.astype(np.float16).view(np.uint16))
    q = rng.standard_normal((new, heads, head_dim)).astype(np.float32)
    positions = np.arange(cached, total, dtype=np.int32)
    out = np.zeros_like(q)
    paged_attention(q.copy(), k_cache, v_cache, table, np.zeros(new, np.int32), positions + 1,
                    np.full(new, new > 1, np.uint8), np.float32(0.3), out)
    k16, v16 = k.astype(np.float16), v.astype(np.float16)
    for i, p in enumerate(positions):
        expected = reference_attention(q[i], k16[:p + 1], v16[:p + 1], 0.3)
        np.testing.assert_allclose(out[i], expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("window", [1, 5, 40, 64, 100])
@pytest.mark.parametrize("cached,new,prompt", [(0, 150, True), (70, 61, True), (130, 9, True), (190, 3, False)])
@pytest.mark.parametrize("avx512", [False, True])
def test_sliding_window_sees_only_the_last_window_positions(window, cached, new, prompt, avx512):
    """window > 0 (gemma3's local layers): token at position p attends to [p + 1 - window, p] only,
    read through the same scattered block table; prompt and decode orders, spans starting past 0."""
    rng = np.random.default_rng(window * 1000 + cached + new)
    heads, kv_heads, head_dim, block_size, num_blocks = 8, 2, 16, 16, 16
    total = cached + new
    table, k_cache, v_cache, k, v, slots = cached_sequence(rng, total, block_size, num_blocks, kv_heads, head_dim)
    q = rng.standard_normal((new, heads, head_dim)).astype(np.float32)
    positions = np.arange(cached, total, dtype=np.int32)
    out = np.zeros_like(q)
    paged_attention(q.copy(), k_cache, v_cache, table, np.zeros(new, np.int32), positions + 1,
                    np.full(new, prompt, np.uint8), np.float32(0.3), out, avx512=avx512, window=window)
    k16, v16 = k.astype(np.float16), v.astype(np.float16)
    for i, p in enumerate(positions):
        first = max(0, p + 1 - window)
        expected = reference_attention(q[i], k16[first:p + 1], v16[first:p + 1], 0.3)
        np.testing.assert_allclose(out[i], expected, rtol=RTOL, atol=ATOL)


def test_a_window_wider_than_the_context_is_bit_equal_to_full_attention():
    rng = np.random.default_rng(5)
    heads, kv_heads, head_dim, block_size = 4, 1, 256, 16
    total = 90
    table = scatter_blocks(rng, total, block_size, 8)[None, :]
    k_cache = rng.standard_normal((8, block_size, kv_heads, head_dim)).astype(np.float16).view(np.uint16)
    v_cache = rng.standard_normal((8, block_size, kv_heads, head_dim)).astype(np.float16).view(np.uint16)
    q = rng.standard_normal((total, heads, head_dim)).astype(np.float32)
    outs = []
    for window in (0, total, 512):
        out = np.zeros_like(q)
        paged_attention(q.copy(), k_cache, v_cache, table, np.zeros(total, np.int32),
                        np.arange(1, total + 1, dtype=np.int32), np.ones(total, np.uint8), np.float32(1.0), out,
                        window=window)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


# ------------------------------------------------- frozen reference: the kernels before vectorizing
# Verbatim copies (renamed) of write_kv / paged_attention as of commit c02f1b9: the fast
# kernels must stay bit-for-bit equal to them.


@njit(parallel=True, cache=True)
def reference_write_kv(k, v, slot_mapping, k_cache, v_cache, scratch_bits):
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
def _reference_reduce_32(lanes, at):
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
def _reference_dot_f16(a, b, prompt_order, lanes):
    n = a.shape[0]
    if prompt_order:
        for i in range(8):
            lanes[i] = a[i] * b[i]
        for s in range(8, n, 8):
            for i in range(8):
                lanes[i] += a[s + i] * b[s + i]
        return hsum8(lanes, 0)
    vector_end = n // 32 * 32
    total = 0.0
    if vector_end > 0:
        for i in range(32):
            lanes[i] = a[i] * b[i]
        for s in range(32, vector_end, 32):
            for i in range(32):
                lanes[i] += a[s + i] * b[s + i]
        total = np.float64(_reference_reduce_32(lanes, 0))
    for i in range(vector_end, n):
        total += np.float64(a[i] * b[i])
    return np.float32(total)


@njit(parallel=True, cache=True)
def reference_paged_attention(q, k_cache, v_cache, block_tables, token_seq, token_context, prompt_order, scale,
                              scores, lanes, row_bits, row_values, out):
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
        small = np.empty(32, np.float32)
        qk_prompt = prompt_order[t] != 0 and head_dim % 8 == 0
        pv_prompt = prompt_order[t] != 0 and head_dim % 4 == 0
        num_lanes = 8 if pv_prompt else 32
        lane_mask = num_lanes - 1
        for g in range(group):
            h = kv_head * group + g
            for d in range(head_dim):
                q[t, h, d] = round_to_half(q[t, h, d])
        for p in range(context):
            block, offset = table[p // block_size], p % block_size
            half_bits_to_float(k_cache[block, offset, kv_head], bits, values)
            for g in range(group):
                h = kv_head * group + g
                score[g, p] = _reference_dot_f16(values, q[t, h], qk_prompt, small) * scale
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
            if full < context:
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
                    out[t, h, d] = _reference_reduce_32(acc[g, :, d], 0)


# ------------------------------------------ the vectorized kernels are bit-equal to the frozen ones

def random_batch(rng, heads, kv_heads, head_dim, block_size, runs, prompt_order_flag, arena_layout):
    """Sequences s with runs[s] = (context, new tokens): the new tokens are the last positions, as in
    decode (1 token) or a prompt chunk on top of cached tokens. KV in one random cache whose
    blocks are scattered; arena_layout stores each (block, kv_head) tile contiguously as KVArena does."""
    needed = [-(-context // block_size) for context, _ in runs]
    num_blocks = sum(needed) + 5
    shape = (num_blocks, kv_heads, block_size, head_dim) if arena_layout else (num_blocks, block_size, kv_heads, head_dim)
    caches = [(rng.standard_normal(shape) * scale).astype(np.float16).view(np.uint16) for scale in (2.0, 1.0)]
    if arena_layout:
        caches = [c.transpose(0, 2, 1, 3) for c in caches]
    tables = np.zeros((len(runs), max(needed)), np.int32)
    order = rng.permutation(num_blocks)
    seq, context, prompt_order = [], [], []
    used = 0
    for s, ((last, new), n) in enumerate(zip(runs, needed)):
        tables[s, :n] = order[used:used + n]
        used += n
        seq += [s] * new
        context += list(range(last - new + 1, last + 1))
        prompt_order += [prompt_order_flag if new > 1 else 0] * new
    q = (rng.standard_normal((len(seq), heads, head_dim)) * 3).astype(np.float32)
    return (q, caches[0], caches[1], tables, np.array(seq, np.int32), np.array(context, np.int32),
            np.array(prompt_order, np.uint8))


def frozen_attention(q, k_cache, v_cache, tables, seq, context, prompt_order, scale):
    threads, group, head_dim = numba.config.NUMBA_NUM_THREADS, q.shape[1] // k_cache.shape[2], q.shape[2]
    q, out = q.copy(), np.zeros_like(q)
    reference_paged_attention(q, k_cache, v_cache, tables, seq, context, prompt_order, scale,
                              np.zeros((threads, group, int(context.max())), np.float32),
                              np.zeros((threads, group, 32, head_dim), np.float32),
                              np.zeros((threads, head_dim), np.uint32), np.zeros((threads, head_dim), np.float32), out)
    return q, out


# (context, new tokens) per sequence: block (5, 16) and span (64) edges, decode and prompt runs
RUNS = [[(1, 1)], [(16, 1), (17, 1), (65, 1)], [(33, 1), (80, 11)], [(15, 15), (5, 1), (130, 9), (64, 2)]]


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
@pytest.mark.parametrize("arena_layout", [True, False], ids=["arena", "contiguous"])
@pytest.mark.parametrize("block_size", [16, 5])
@pytest.mark.parametrize("head_dim", [64, 48, 20])
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (3, 3)], ids=["group3", "group1"])
@pytest.mark.parametrize("prompt", [0, 1], ids=["decode_order", "prompt_order"])
def test_kernel_is_bit_equal_to_the_frozen_reference(prompt, heads, kv_heads, head_dim, block_size, arena_layout,
                                                     parallel):
    rng = np.random.default_rng(head_dim * 100 + block_size * 10 + heads + prompt)
    scale = np.float32(1.0) / np.sqrt(np.float32(head_dim))
    for runs in RUNS:
        q, k_cache, v_cache, tables, seq, context, prompt_order = random_batch(rng, heads, kv_heads, head_dim, block_size,
                                                                          runs, prompt, arena_layout)
        expected_q, expected = frozen_attention(q, k_cache, v_cache, tables, seq, context, prompt_order, scale)
        got_q, got = q.copy(), np.full_like(q, np.nan)
        paged_attention(got_q, k_cache, v_cache, tables, seq, context, prompt_order, scale, got, parallel=parallel)
        assert np.array_equal(got.view(np.uint32), expected.view(np.uint32)), runs
        assert np.array_equal(got_q.view(np.uint32), expected_q.view(np.uint32)), runs


@pytest.mark.parametrize("head_dim", [64, 80])
def test_decode_order_over_long_contexts_is_bit_equal_to_the_frozen_reference(head_dim):
    """Contexts past LANE_ROWS rows per lane: each lane's accumulators carried across its row groups."""
    rng = np.random.default_rng(head_dim)
    scale = np.float32(1.0) / np.sqrt(np.float32(head_dim))
    q, k_cache, v_cache, tables, seq, context, prompt_order = random_batch(rng, 9, 3, head_dim, 16,
                                                                          [(1100, 1), (530, 2)], 0, True)
    expected_q, expected = frozen_attention(q, k_cache, v_cache, tables, seq, context, prompt_order, scale)
    got = np.full_like(q, np.nan)
    paged_attention(q, k_cache, v_cache, tables, seq, context, prompt_order, scale, got, parallel=False)
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("member,members", [(1, 1), (2, 2), (-1, 2), (0, 0)])
def test_a_member_outside_its_team_is_refused(member, members):
    q, k_cache, v_cache, tables, seq, context, prompt_order = random_batch(np.random.default_rng(3), 9, 3, 64, 16,
                                                                          [(40, 1), (70, 1)], 0, True)
    out = np.zeros_like(q)
    with pytest.raises(ValueError, match="member must be in"):
        paged_attention_serial(q, k_cache, v_cache, tables, seq, context, prompt_order, np.float32(0.125), out,
                               attention_work(9, 3, 64, 128), True, 0, member, members)


def test_automatic_driver_choice_with_a_preallocated_work_buffer():
    """The call transformer.py makes (work buffer allocated once for the longest context) picks a driver by size."""
    rng = np.random.default_rng(5)
    for runs in ([(40, 1)], [(300, 30)]):
        q, k_cache, v_cache, tables, seq, context, prompt_order = random_batch(rng, 9, 3, 64, 16, runs, 1, True)
        expected_q, expected = frozen_attention(q, k_cache, v_cache, tables, seq, context, prompt_order, np.float32(0.125))
        out = np.zeros_like(q)
        work = attention_work(9, 3, 64, max_context=512)
        paged_attention(q, k_cache, v_cache, tables, seq, context, prompt_order, np.float32(0.125), out, work)
        assert np.array_equal(out.view(np.uint32), expected.view(np.uint32))
        assert np.array_equal(q.view(np.uint32), expected_q.view(np.uint32))


@pytest.mark.parametrize("arena_layout", [True, False], ids=["arena", "contiguous"])
@pytest.mark.parametrize("head_dim", [64, 20])
def test_write_kv_is_bit_equal_to_the_frozen_reference(arena_layout, head_dim):
    rng = np.random.default_rng(head_dim)
    kv_heads, block_size, num_blocks, tokens = 3, 16, 6, 37
    special = np.array([0.0, -0.0, 65504.0, 65519.0, 65520.0, -70000.0, 1e-8, -3e-6, 6.1e-5, np.inf, -np.inf, np.nan],
                       np.float32)
    k = (rng.standard_normal((tokens, kv_heads, head_dim)) * 10).astype(np.float32)
    v = rng.standard_normal((tokens, kv_heads, head_dim)).astype(np.float32)
    k.reshape(-1)[:special.size] = special
    v.reshape(-1)[-special.size:] = special
    slots = rng.permutation(num_blocks * block_size)[:tokens].astype(np.int32)
    caches = []
    for writer in ("frozen", "new"):
        if arena_layout:
            k_cache = np.zeros((num_blocks, kv_heads, block_size, head_dim), np.uint16).transpose(0, 2, 1, 3)
        else:
            k_cache = np.zeros((num_blocks, block_size, kv_heads, head_dim), np.uint16)
        v_cache = np.zeros_like(k_cache)
        if writer == "frozen":
            reference_write_kv(k, v, slots, k_cache, v_cache, np.zeros((tokens, head_dim), np.uint16))
        else:
            write_kv(k, v, slots, k_cache, v_cache, np.zeros(head_dim, np.float32), np.zeros(8, np.uint16))
        caches.append((k_cache, v_cache))
    assert np.array_equal(caches[0][0], caches[1][0])
    assert np.array_equal(caches[0][1], caches[1][1])


def outputs_of_both_orders():
    """paged_attention's outputs on fixed random batches (RUNS), both orders, both builds' sums."""
    outputs = {}
    for head_dim in (64, 48):
        for prompt in (0, 1):
            rng = np.random.default_rng(head_dim + prompt)
            for r, runs in enumerate(RUNS):
                batch = random_batch(rng, 9, 3, head_dim, 16, runs, prompt, True)
                for avx512 in (False, True):
                    q, out = batch[0].copy(), np.full_like(batch[0], np.nan)
                    paged_attention(q, *batch[1:], np.float32(0.125), out, avx512=avx512)
                    outputs[f"{head_dim}-{prompt}-{r}-{avx512}"] = out
    return outputs


_OTHER_CPU_OUTPUTS = textwrap.dedent("""
    import sys
    import numpy as np
    from test_attention import outputs_of_both_orders
    np.savez(sys.argv[1], **outputs_of_both_orders())
""")


@pytest.mark.parametrize("cpu", ["ivybridge", "haswell"])
def test_kernel_compiled_for_other_cpus_is_bit_equal(cpu, tmp_path):
    """Both summation orders compiled in a subprocess for "ivybridge" (AVX and F16C, no FMA: the
    exact products are multiplied, then added) and "haswell" (AVX2 and FMA), bit-equal to this
    machine's build. (Not "generic": without F16C the fp16 conversions need __extendhfsf2,
    which numba's JIT cannot link: LLVM aborts.)"""
    path = os.pathsep.join([REPO_ROOT, os.path.join(REPO_ROOT, "test", "kernels")])
    env = dict(os.environ, NUMBA_CPU_NAME=cpu, PYTHONPATH=path)
    result = subprocess.run([sys.executable, "-c", _OTHER_CPU_OUTPUTS, str(tmp_path / "other.npz")], cwd=REPO_ROOT,
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    other = np.load(tmp_path / "other.npz")
    here = outputs_of_both_orders()
    assert sorted(other.files) == sorted(here) and len(here) == 2 * 2 * len(RUNS) * 2
    for key, out in here.items():
        assert np.array_equal(other[key].view(np.uint32), out.view(np.uint32)), (cpu, key)
