"""Paged attention over one fp16 KV arena (uint16 bit patterns; numba has no float16).

Per layer the cache is k_cache, v_cache (num_blocks, block_size, kv_heads, head_dim), any
strides with head_dim contiguous; fastest when each (block, kv_head) tile of block_size x
head_dim is contiguous, which is how kv/arena.py lays the arena out. A token's position p
lives in block block_table[p // block_size] at offset p % block_size.

Numerics are those of llama.cpp's CPU path without flash attention (x86 AVX2 build): q and the
probabilities are rounded to fp16 (they are converted for the F16 x F16 matmuls), scores and
softmax in float32 with its vector exp (ggml_v_expf), the softmax sum in float64 over 8-wide
groups. Every product of two fp16 values is exact in float32, so only the order of the sums
matters, and llama.cpp uses two orders:

- one token per llama_decode (decode): ggml_vec_dot_f16, 32 lanes (4 vectors x 8), lane
  i sums elements i, i+32, i+64, ...; then vectors (1+3)+(0+2), halves, pairs
  (`reduce_32`; elements past the last multiple of 32 are added in float64 afterwards).
- two or more tokens in one batch (prompt): llamafile's tinyBLAS F16 gemm, 8 lanes, lane i
  sums elements i, i+8, ...; then hsum_float_8 (`hsum8`). It is used when the dot length
  is a multiple of 8 (and, for V, head_dim a multiple of 4); otherwise ggml falls back to
  the decode order.

`prompt_order[t]` (T,) selects the prompt order for token t. The dot over positions (probabilities
. V) runs over llama.cpp's padded KV length; positions past the context hold zero
probability, which leaves every lane sum unchanged, so only [0, context) is visited.

How it runs: consecutive tokens of one sequence in one order form a chunk (up to
PROMPT_CHUNK queries, DECODE_CHUNK in the one-token order); one work item is a (chunk,
kv_head). An item converts each K (then V) tile of block_size x head_dim to float32 once
and uses it for every query head of the group and every query of the chunk; each query keeps
its own summation order exactly (vectors run along head_dim, or along the output elements
for P . V, never across the summed index). In the AVX-512 orders with head_dim 64, QK runs three
query heads at a time on each K row, and reduces 16 positions' lanes together (`scores_64_three`).
In the AVX-512 decode order, a context of at most VALUE_ROWS positions has P . V summed with the 64
lanes in registers, 16 output elements and three query heads at a time (`lane_sums_wide_three`;
`lane_sums_wide` for the heads left over); the decode orders over longer contexts go lane by lane
(a lane's positions are every 32nd or 64th): its V rows converted once for every query head, its
accumulators in registers rather than a store per position. Small calls run on the calling thread (no parallel
region: waking numba's workers costs 12-70 us here), larger ones on the thread pool with items
interleaved so that causal prefill splits evenly.
"""
import numba
import numpy as np
from numba import njit, prange

from . import simd, vec8
from .attention_math import (DECODE_LANES, LANE_ROWS, LANE_SUMS_SCRATCH, MIN_ROWS_BY_LANE, PREFETCH_SPANS,
                             PROMPT_LANES, SPAN, VALUE_PAD, VALUE_ROWS, WIDE_DECODE_LANES, WIDE_PROMPT_LANES, hsum_rows,
                             lane_sums_wide, lane_sums_wide_three, load_span, load_strided, prefetch_rows, reduce_16,
                             reduce_16_rows, reduce_32, reduce_64, reduce_64_rows, reduce_rows, scores_64,
                             scores_64_three, scores_64_wide, scores_128_wide, scores_any, weighted_lane, weighted_rows,
                             weighted_rows_streamed)
from .half import round_to_half

PROMPT_CHUNK = 8          # queries per item in the prompt order (8 lanes of accumulators each)
DECODE_CHUNK = 2          # the same accumulator space holds 2 queries of 32 lanes
# Below this many multiply-adds (QK plus PV) a call runs on the calling thread.
PARALLEL_MIN_MACS = 500_000
_MULTI_THREADED = numba.config.NUMBA_NUM_THREADS > 1


@njit(cache=True)
def _work_size(group, head_dim, max_context):
    """Float32 scratch one item needs (see _attend_body) for contexts up to max_context."""
    width = (max_context + 15) // 16 * 16
    chunk = max(PROMPT_CHUNK, DECODE_CHUNK)
    return chunk * group * (head_dim + width) + PROMPT_CHUNK * WIDE_PROMPT_LANES * group * head_dim \
        + max(SPAN * head_dim, VALUE_ROWS * (head_dim + VALUE_PAD)) + max(3 * head_dim, WIDE_DECODE_LANES) \
        + LANE_SUMS_SCRATCH


@njit(cache=True, inline="always")
def window_base(token_context, first_token, count, max_context, window):
    """First position the queries first_token..+count read: 0, or with a window the earliest
    c - window rounded down to a multiple of SPAN."""
    if window <= 0:
        return 0
    low = max_context
    for m in range(count):
        low = min(low, max(0, token_context[first_token + m] - window))
    return low // SPAN * SPAN


@njit(cache=True)
def _attend(q, k_cache, v_cache, table, first_token, count, token_context, kv_head, prompt, scale, out, work,
            avx512, window):
    """Queries first_token..+count (one sequence, one order) x one kv_head -> out; q rounded in place.
    work: float32 scratch of _work_size elements; avx512: the AVX-512 build's orders; window > 0:
    a query at context c sees only positions [c - window, c)."""
    simd.align_stack_frame()
    if q.shape[2] == 64:             # a literal: the inlined copy has constant offsets
        _attend_body(q, k_cache, v_cache, table, first_token, count, token_context, kv_head, prompt, scale, out,
                     work, 64, avx512, window)
    elif q.shape[2] == 128:
        _attend_body(q, k_cache, v_cache, table, first_token, count, token_context, kv_head, prompt, scale, out,
                     work, 128, avx512, window)
    else:
        _attend_body(q, k_cache, v_cache, table, first_token, count, token_context, kv_head, prompt, scale, out,
                     work, q.shape[2], avx512, window)


@njit(cache=True, inline="always")
def _attend_body(q, k_cache, v_cache, table, first_token, count, token_context, kv_head, prompt, scale, out,
                 work, head_dim, avx512, window):
    group = q.shape[1] // k_cache.shape[2]
    prompt_lanes = WIDE_PROMPT_LANES if avx512 else PROMPT_LANES
    qk_prompt = prompt and head_dim % prompt_lanes == 0
    pv_prompt = prompt and head_dim % 4 == 0
    if avx512:
        num_lanes = WIDE_PROMPT_LANES if pv_prompt else WIDE_DECODE_LANES
    else:
        num_lanes = PROMPT_LANES if pv_prompt else DECODE_LANES
    vector_end = head_dim // 8 * 8
    max_context = 0
    for m in range(count):
        max_context = max(max_context, token_context[first_token + m])
    width = (max_context + 15) // 16 * 16
    # Sliding window: the spans start at `base`, a multiple of SPAN, so every position keeps the
    # accumulator lane and the 8/16-position softmax group it has in llama.cpp's full-length rows;
    # positions of [base, c - window) are masked (probability 0, as llama.cpp's -inf mask).
    base = window_base(token_context, first_token, count, max_context, window)
    # scratch, flat: queries (count, group, head_dim), scores (count, group, width),
    # acc (count, group, num_lanes, head_dim), span (SPAN rows, or VALUE_ROWS padded ones), result
    end = count * group * head_dim
    queries = work[:end]
    scores = work[end:end + count * group * width]
    end += count * group * width
    acc = work[end:end + count * group * num_lanes * head_dim]
    end += count * group * num_lanes * head_dim
    span_size = max(SPAN * head_dim, VALUE_ROWS * (head_dim + VALUE_PAD))
    span = work[end:end + span_size]
    end += span_size
    result = work[end:end + max(3 * head_dim, WIDE_DECODE_LANES) + LANE_SUMS_SCRATCH]
    # P . V: 64 lanes in registers, or by weighted_rows_streamed or by lane (acc cleared there)
    in_registers = avx512 and not pv_prompt and head_dim % 16 == 0 and max_context - base <= VALUE_ROWS
    streamed = num_lanes >= DECODE_LANES
    by_lane = streamed and not in_registers and max_context - base >= MIN_ROWS_BY_LANE * num_lanes
    if not streamed:
        for i in range(0, acc.shape[0] // 8 * 8, 8):
            simd.store_f32x8(acc, i, simd.zeros_f32x8())
        for i in range(acc.shape[0] // 8 * 8, acc.shape[0]):
            acc[i] = 0.0
    # q rounded to fp16, in place and into `queries`
    for m in range(count):
        for g in range(group):
            h = kv_head * group + g
            at = (m * group + g) * head_dim
            for d in range(head_dim):
                queries[at + d] = q[first_token + m, h, d]
            for d in range(0, vector_end, 8):
                simd.store_f32x8(queries, at + d, vec8.round_half(simd.load_f32x8(queries, at + d)))
            for d in range(vector_end, head_dim):
                queries[at + d] = round_to_half(queries[at + d])
            for d in range(head_dim):
                q[first_token + m, h, d] = queries[at + d]
    # scores = (K . q) * scale
    num_spans = (max_context - base + SPAN - 1) // SPAN
    for start in range(base, max_context, SPAN):
        rows = min(SPAN, max_context - start)
        # rows PREFETCH_SPANS spans ahead (after the last K span: the first V spans) load while
        # this span computes
        ahead = start + PREFETCH_SPANS * SPAN
        if ahead < max_context:
            prefetch_rows(k_cache, table, kv_head, ahead, min(ahead + SPAN, max_context), head_dim)
        elif ahead - num_spans * SPAN < max_context:
            ahead -= num_spans * SPAN
            prefetch_rows(v_cache, table, kv_head, ahead, min(ahead + SPAN, max_context), head_dim)
        load_span(k_cache, table, kv_head, start, rows, span, head_dim, head_dim)
        for m in range(count):
            n = min(rows, token_context[first_token + m] - start)
            trios = group // 3 * 3 if head_dim == 64 and avx512 else 0
            for g in range(0, trios, 3):         # three query heads at once
                scores_64_three(span, n, queries, (m * group + g) * head_dim, qk_prompt, scale, scores,
                                (m * group + g) * width + start, width)
            for g in range(trios, group):
                at_q = (m * group + g) * head_dim
                at_s = (m * group + g) * width + start
                if head_dim == 64 and avx512:
                    scores_64_wide(span, n, queries, at_q, qk_prompt, scale, scores, at_s)
                elif head_dim == 64:
                    scores_64(span, n, queries, at_q, qk_prompt, scale, scores, at_s)
                elif head_dim == 128 and avx512:
                    scores_128_wide(span, n, queries, at_q, qk_prompt, scale, scores, at_s)
                else:
                    scores_any(span, n, head_dim, queries, at_q, qk_prompt, scale, scores, at_s, avx512)
    # softmax: vector exp, float32 sums of 8 (avx512: 16) aligned positions accumulated in float64
    for m in range(count):
        context = token_context[first_token + m]
        full = context // 8 * 8
        for g in range(group):
            at = (m * group + g) * width
            if window > 0:
                for p in range(base, max(base, context - window)):
                    scores[at + p] = np.float32(-np.inf)
            peak = np.float32(-np.inf)
            if full > base:
                best = simd.load_f32x8(scores, at + base)
                for s in range(base + 8, full, 8):
                    best = vec8.maximum(best, simd.load_f32x8(scores, at + s))
                peak = vec8.max_lane(best)
            for p in range(max(full, base), context):
                peak = max(peak, scores[at + p])
            top = simd.splat_f32(peak)
            total = 0.0
            if avx512:                           # positions past the context are 0 (masked)
                for s in range(base, context, 16):
                    low = vec8.keep_first(vec8.exp_wide(vec8.sub(simd.load_f32x8(scores, at + s), top)), context - s)
                    high = vec8.keep_first(vec8.exp_wide(vec8.sub(simd.load_f32x8(scores, at + s + 8), top)),
                                           context - s - 8)
                    simd.store_f32x8(scores, at + s, low)
                    simd.store_f32x8(scores, at + s + 8, high)
                    total += np.float64(vec8.hsum(simd.add(high, low)))
            else:
                for s in range(base, full, 8):
                    e = vec8.exp(vec8.sub(simd.load_f32x8(scores, at + s), top))
                    simd.store_f32x8(scores, at + s, e)
                    total += np.float64(vec8.hsum(e))
                if full < context:               # last group: positions past the context are 0
                    e = vec8.keep_first(vec8.exp(vec8.sub(simd.load_f32x8(scores, at + full), top)), context - full)
                    simd.store_f32x8(scores, at + full, e)
                    total += np.float64(vec8.hsum(e))
            inverse = simd.splat_f32(np.float32(1.0 / total))
            for s in range(base, context, 8):
                simd.store_f32x8(scores, at + s, vec8.round_half(simd.mul(simd.load_f32x8(scores, at + s), inverse)))
    # out = P . V: lane p % num_lanes of each output element sums its positions in order
    if in_registers:
        _weighted_in_registers(v_cache, table, kv_head, base, max_context, first_token, count, token_context, group,
                               width, scores, span, result, out, head_dim)
    elif by_lane:
        _weighted_by_lane(v_cache, table, kv_head, base, max_context, first_token, count, token_context, group,
                          width, scores, num_lanes, acc, span, head_dim)
    else:
        for start in range(base, max_context, SPAN):
            rows = min(SPAN, max_context - start)
            ahead = start + PREFETCH_SPANS * SPAN
            if ahead < max_context:
                prefetch_rows(v_cache, table, kv_head, ahead, min(ahead + SPAN, max_context), head_dim)
            load_span(v_cache, table, kv_head, start, rows, span, head_dim, head_dim)
            for m in range(count):
                n = min(rows, token_context[first_token + m] - start)
                if n <= 0:
                    continue
                for g in range(group):
                    at_w, at_acc = (m * group + g) * width + start, (m * group + g) * num_lanes * head_dim
                    if streamed:
                        weighted_rows_streamed(span, n, head_dim, scores, at_w, num_lanes, acc, at_acc, start == base)
                    else:
                        weighted_rows(span, n, head_dim, scores, at_w, num_lanes, acc, at_acc)
    if in_registers:                             # out written already
        return
    for m in range(count):
        t = first_token + m
        for g in range(group):
            at = (m * group + g) * num_lanes * head_dim
            for d in range(0, vector_end, 8):
                if pv_prompt and avx512:
                    simd.store_f32x8(result, d, reduce_16_rows(acc, at + d, head_dim))
                elif avx512:
                    simd.store_f32x8(result, d, reduce_64_rows(acc, at + d, head_dim))
                elif pv_prompt:
                    simd.store_f32x8(result, d, hsum_rows(acc, at + d, head_dim))
                else:
                    simd.store_f32x8(result, d, reduce_rows(acc, at + d, head_dim))
            h = kv_head * group + g
            for d in range(0, vector_end):
                out[t, h, d] = result[d]
            for d in range(vector_end, head_dim):
                if avx512:                       # result (>= 64 floats) as lane scratch
                    for lane in range(num_lanes):
                        result[lane] = acc[at + d + lane * head_dim]
                    out[t, h, d] = reduce_16(result, 0) if pv_prompt else reduce_64(result, 0)
                    continue
                if pv_prompt:
                    lanes = acc[at + d:at + d + 8 * head_dim:head_dim]
                    a0 = lanes[4] + lanes[0]
                    a1 = lanes[5] + lanes[1]
                    a2 = lanes[6] + lanes[2]
                    a3 = lanes[7] + lanes[3]
                    result[d] = (a0 + a2) + (a1 + a3)
                else:
                    result[d] = reduce_32(acc[at + d:at + d + 32 * head_dim:head_dim], 0)
                out[t, h, d] = result[d]


@njit(cache=True, inline="always")
def _weighted_in_registers(v_cache, table, kv_head, base, max_context, first_token, count, token_context, group,
                           width, scores, values, result, out, head_dim):
    """P . V in the AVX-512 decode order by lane_sums_wide -> out, the V rows of [base, max_context)
    (at most VALUE_ROWS) converted to float32 into `values` once for every query head."""
    # the K pass prefetched the first spans; the rest now
    prefetch_rows(v_cache, table, kv_head, min(max_context, base + PREFETCH_SPANS * SPAN), max_context, head_dim)
    rows = max_context - base
    load_span(v_cache, table, kv_head, base, rows, values, head_dim, head_dim + VALUE_PAD)
    for m in range(count):
        t = first_token + m
        n = max(0, min(rows, token_context[t] - base))
        trios = group // 3 * 3
        for g in range(0, trios, 3):             # three query heads at once
            lane_sums_wide_three(values, n, head_dim, head_dim + VALUE_PAD, scores, (m * group + g) * width + base,
                                 width, result)
            for i in range(3):
                h = kv_head * group + g + i
                for d in range(head_dim):
                    out[t, h, d] = result[i * head_dim + d]
        for g in range(trios, group):
            lane_sums_wide(values, n, head_dim, head_dim + VALUE_PAD, scores, (m * group + g) * width + base, result)
            h = kv_head * group + g
            for d in range(head_dim):
                out[t, h, d] = result[d]


@njit(cache=True, inline="always")
def _weighted_by_lane(v_cache, table, kv_head, base, max_context, first_token, count, token_context, group, width,
                      scores, num_lanes, acc, rows, head_dim):
    """P . V in a decode order (32 or 64 lanes), lane by lane: the lane's V rows (positions
    base + lane, + num_lanes, ...) converted to float32 into `rows`, LANE_ROWS at a time, then
    used from L1 by every query head with the lane's accumulators in registers."""
    # the K pass prefetched the first spans; the rest now, or each lane's strided rows wait for memory
    prefetch_rows(v_cache, table, kv_head, min(max_context, base + PREFETCH_SPANS * SPAN), max_context, head_dim)
    for lane in range(num_lanes):
        if base + lane >= max_context:           # no row reaches this lane
            for m in range(count):
                for g in range(group):
                    weighted_lane(rows, 0, head_dim, scores, 0, num_lanes, acc,
                                  ((m * group + g) * num_lanes + lane) * head_dim, True)
            continue
        for first in range(base + lane, max_context, LANE_ROWS * num_lanes):
            converted = min(LANE_ROWS, (max_context - first + num_lanes - 1) // num_lanes)
            load_strided(v_cache, table, kv_head, first, num_lanes, converted, rows, head_dim)
            for m in range(count):
                visible = max(0, token_context[first_token + m] - first)       # positions of this query
                n = min(converted, (visible + num_lanes - 1) // num_lanes)
                starts = first == base + lane
                if n == 0 and not starts:
                    continue
                for g in range(group):
                    weighted_lane(rows, n, head_dim, scores, (m * group + g) * width + first, num_lanes, acc,
                                  ((m * group + g) * num_lanes + lane) * head_dim, starts)


# ------------------------------------------------------------------------------- drivers

@njit(cache=True)
def _chunks(token_seq, prompt_order, head_dim):
    """Consecutive tokens of one sequence and one order -> (first token, count) per chunk."""
    num_tokens = token_seq.shape[0]
    firsts = np.empty(num_tokens, np.int64)
    counts = np.empty(num_tokens, np.int64)
    n = 0
    t = 0
    while t < num_tokens:
        prompt = prompt_order[t] != 0
        limit = PROMPT_CHUNK if prompt and head_dim % 4 == 0 else DECODE_CHUNK
        c = 1
        while c < limit and t + c < num_tokens and token_seq[t + c] == token_seq[t] \
                and (prompt_order[t + c] != 0) == prompt:
            c += 1
        firsts[n], counts[n] = t, c
        n += 1
        t += c
    return firsts[:n], counts[:n]


@njit(cache=True, inline="always")
def _item(i, num_items, kv_heads):
    """Iteration i -> (chunk, kv_head). Items are taken from both ends in turn: with the
    iteration range split into contiguous parts per thread, causal prefill (later chunks
    longer) still splits evenly."""
    j = i // 2 if i % 2 == 0 else num_items - 1 - i // 2
    return j // kv_heads, j % kv_heads


@njit(cache=True, inline="always")
def _prefetch_item(i, num_items, firsts, counts, k_cache, v_cache, block_tables, token_seq, token_context, window):
    """Start loading item i's K and V rows into L2 (KV comes from memory in a real forward pass)."""
    c, kv_head = _item(i, num_items, k_cache.shape[2])
    first = firsts[c]
    context = 0
    for t in range(first, first + counts[c]):
        context = max(context, token_context[t])
    base = window_base(token_context, first, counts[c], context, window)
    table = block_tables[token_seq[first]]
    rows = min(context - base, PREFETCH_SPANS * SPAN)
    prefetch_rows(k_cache, table, kv_head, base, base + rows, k_cache.shape[3])
    if context - base < PREFETCH_SPANS * SPAN:       # the first V spans are due soon too
        prefetch_rows(v_cache, table, kv_head, base, base + min(context - base, PREFETCH_SPANS * SPAN - rows),
                      v_cache.shape[3])


@njit(cache=True, inline="always")
def _run_item(i, num_items, firsts, counts, q, k_cache, v_cache, block_tables, token_seq, token_context,
              prompt_order, scale, out, work, avx512, window):
    if i + 1 < num_items:           # the next item's KV loads while this one computes
        _prefetch_item(i + 1, num_items, firsts, counts, k_cache, v_cache, block_tables, token_seq, token_context,
                       window)
    c, kv_head = _item(i, num_items, k_cache.shape[2])
    first = firsts[c]
    _attend(q, k_cache, v_cache, block_tables[token_seq[first]], first, counts[c], token_context, kv_head,
            prompt_order[first] != 0, scale, out, work, avx512, window)


@njit(cache=True, nogil=True)
def paged_attention_serial(q, k_cache, v_cache, block_tables, token_seq, token_context, prompt_order, scale, out, work,
                           avx512=False, window=0, member=0, members=1):
    """paged_attention on the calling thread only (uses work[0]); with members > 1, only member's
    contiguous share of the work items (each a chunk of tokens x one KV head: a team of threads
    running one forward, each with its own work)."""
    if member < 0 or member >= members:          # past the team, its items would index past the tables
        raise ValueError("paged_attention_serial: member must be in [0, members)")
    firsts, counts = _chunks(token_seq, prompt_order, q.shape[2])
    num_items = firsts.shape[0] * k_cache.shape[2]
    first, last = member * num_items // members, (member + 1) * num_items // members
    if first == last:
        return
    _prefetch_item(first, num_items, firsts, counts, k_cache, v_cache, block_tables, token_seq, token_context, window)
    for i in range(first, last):
        _run_item(i, num_items, firsts, counts, q, k_cache, v_cache, block_tables, token_seq, token_context,
                  prompt_order, scale, out, work[0], avx512, window)


@njit(parallel=True, cache=True)
def paged_attention_parallel(q, k_cache, v_cache, block_tables, token_seq, token_context, prompt_order, scale, out, work,
                             avx512=False, window=0):
    """paged_attention with its work items on numba's thread pool (work row per thread)."""
    firsts, counts = _chunks(token_seq, prompt_order, q.shape[2])
    num_items = firsts.shape[0] * k_cache.shape[2]
    if num_items == 0:
        return
    for i in prange(num_items):
        # which items a thread gets is up to the scheduler: each item also prefetches its own rows
        _prefetch_item(i, num_items, firsts, counts, k_cache, v_cache, block_tables, token_seq, token_context,
                       window)
        _run_item(i, num_items, firsts, counts, q, k_cache, v_cache, block_tables, token_seq, token_context,
                  prompt_order, scale, out, work[numba.get_thread_id()], avx512, window)


def attention_work(num_heads: int, kv_heads: int, head_dim: int, max_context: int, allocate=None) -> np.ndarray:
    """Scratch for paged_attention over contexts up to max_context: one float32 row per numba thread.
    allocate(shape, dtype) -> touched zeros, if given (guard zones)."""
    shape = (numba.config.NUMBA_NUM_THREADS, _work_size(num_heads // kv_heads, head_dim, max_context))
    if allocate is not None:
        return allocate(shape, np.float32)
    work = np.empty(shape, np.float32)
    work.fill(0)          # touched now: the part a context reaches first would page-fault mid-decode
    return work


def check_work(work: np.ndarray, num_heads: int, kv_heads: int, head_dim: int, context: int) -> None:
    """ValueError unless work (from attention_work) is big enough for contexts up to `context`."""
    if work.shape[1] < _work_size(num_heads // kv_heads, head_dim, context):
        raise ValueError(f"attention work buffer too small for a context of {context}")


def paged_attention(q, k_cache, v_cache, block_tables, token_seq, token_context, prompt_order, scale, out,
                    work=None, parallel=None, avx512=False, window=0):
    """q (T, heads, head_dim) f32; token t attends to positions [0, token_context[t]) of sequence
    token_seq[t] via block_tables (S, max_blocks), in prompt order if prompt_order[t] (T,) is nonzero
    -> out (T, heads, head_dim) f32. q is rounded to fp16 in place.
    work: attention_work(...) for at least max(token_context) (allocated per call if None).
    parallel: None = thread pool only when the call is big enough to repay waking it, or force True/False.
    avx512: the summation orders and exp of llama.cpp's AVX-512 build (else of its AVX2 build).
    window > 0: token t sees only positions [token_context[t] - window, token_context[t]) (a
    sliding-window layer; llama.cpp's LLAMA_SWA_TYPE_STANDARD mask), read through the same tables.
    """
    num_tokens, num_heads, head_dim = q.shape
    if num_tokens == 0:
        return
    context = int(token_context[0]) if num_tokens == 1 else int(token_context.max())
    if work is None:
        work = attention_work(num_heads, k_cache.shape[2], head_dim, context)
    else:
        check_work(work, num_heads, k_cache.shape[2], head_dim, context)
    if parallel is None:
        parallel = _MULTI_THREADED and num_tokens * num_heads * head_dim * 2 * context >= PARALLEL_MIN_MACS
    args = (q, k_cache, v_cache, block_tables, token_seq, token_context, prompt_order, scale, out, work, avx512, window)
    if parallel:
        paged_attention_parallel(*args)
    else:       # member and members given: a call from Python that omits them took ~90 us more (numba 0.68)
        paged_attention_serial(*args, 0, 1)
