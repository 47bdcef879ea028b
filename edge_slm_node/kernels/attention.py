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
  (`_reduce_32`; elements past the last multiple of 32 are added in float64 afterwards).
- two or more tokens in one batch (prompt): llamafile's tinyBLAS F16 gemm, 8 lanes, lane i
  sums elements i, i+8, ...; then hsum_float_8 (`hsum8`). It is used when the dot length
  is a multiple of 8 (and, for V, head_dim a multiple of 4); otherwise ggml falls back to
  the decode order.

`batched[t]` (T,) selects the prompt order for token t. The dot over positions (probabilities
. V) runs over llama.cpp's padded KV length; positions past the context hold zero
probability, which leaves every lane sum unchanged, so only [0, context) is visited.

How it runs: consecutive tokens of one sequence in one order form a chunk (up to
PROMPT_CHUNK queries, DECODE_CHUNK in the one-token order); one work item is a (chunk,
kv_head). An item converts each K (then V) tile of block_size x head_dim to float32 once
and uses it for every query head of the group and every query of the chunk; each query keeps
its own summation order exactly (vectors run along head_dim, or along the output elements
for P . V, never across the summed index). Small calls run on the calling thread (no parallel
region: waking numba's workers costs 12-70 us here), larger ones on the thread pool with items
interleaved so that causal prefill splits evenly.
"""
import numba
import numpy as np
from numba import njit, prange

from . import simd, vec8
from .half import round_to_half
from .ops import bits_float, hsum8

DECODE_LANES = 32
PROMPT_LANES = 8
PROMPT_CHUNK = 8          # queries per item in the prompt order (8 lanes of accumulators each)
DECODE_CHUNK = 2          # the same accumulator space holds 2 queries of 32 lanes
# Below this many multiply-adds (QK plus PV) a call runs on the calling thread.
PARALLEL_MIN_MACS = 500_000
_MULTI_THREADED = numba.config.NUMBA_NUM_THREADS > 1


# ---------------------------------------------------------------------------- scalar helpers

@njit(cache=True, inline="always")
def _half_to_float(h):
    """One fp16 bit pattern -> float32, as half.half_bits_to_float."""
    w = np.uint32(h)
    bits = ((w & np.uint32(0x7FFF)) << np.uint32(13)) | ((w & np.uint32(0x8000)) << np.uint32(16))
    return bits_float(bits) * np.float32(2.0 ** 112)


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
    """a . b for fp16-valued float32 vectors of one length, in llama.cpp's order; lanes: 32 f32 scratch.
    (Scalar statement of the two orders; the kernels use the vector forms `_dot_prompt`/`_dot_decode`.)"""
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


@njit(cache=True, inline="always")
def _dot_prompt(k, at_k, q, at_q, n):
    """k.flat[at_k:at_k+n] . q.flat[at_q:at_q+n], n a multiple of 8, tinyBLAS order (8 lanes, hsum8)."""
    acc = simd.mul(simd.load_f32x8(k, at_k), simd.load_f32x8(q, at_q))
    for s in range(8, n, 8):
        acc = simd.add(acc, simd.mul(simd.load_f32x8(k, at_k + s), simd.load_f32x8(q, at_q + s)))
    return vec8.hsum(acc)


@njit(cache=True, inline="always")
def _dot_decode(k, at_k, q, at_q, n):
    """The same in ggml_vec_dot_f16's order (32 lanes, vec8.reduce32; the rest in float64)."""
    vector_end = n // DECODE_LANES * DECODE_LANES
    total = 0.0
    if vector_end > 0:
        a0 = simd.mul(simd.load_f32x8(k, at_k), simd.load_f32x8(q, at_q))
        a1 = simd.mul(simd.load_f32x8(k, at_k + 8), simd.load_f32x8(q, at_q + 8))
        a2 = simd.mul(simd.load_f32x8(k, at_k + 16), simd.load_f32x8(q, at_q + 16))
        a3 = simd.mul(simd.load_f32x8(k, at_k + 24), simd.load_f32x8(q, at_q + 24))
        for s in range(DECODE_LANES, vector_end, DECODE_LANES):
            a0 = simd.add(a0, simd.mul(simd.load_f32x8(k, at_k + s), simd.load_f32x8(q, at_q + s)))
            a1 = simd.add(a1, simd.mul(simd.load_f32x8(k, at_k + s + 8), simd.load_f32x8(q, at_q + s + 8)))
            a2 = simd.add(a2, simd.mul(simd.load_f32x8(k, at_k + s + 16), simd.load_f32x8(q, at_q + s + 16)))
            a3 = simd.add(a3, simd.mul(simd.load_f32x8(k, at_k + s + 24), simd.load_f32x8(q, at_q + s + 24)))
        total = np.float64(vec8.reduce32(a0, a1, a2, a3))
    for i in range(vector_end, n):
        total += np.float64(k[at_k + i] * q[at_q + i])
    return np.float32(total)


@njit(cache=True, inline="always")
def _hsum_rows(acc, at, step):
    """hsum8 across 8 rows acc.flat[at + r*step : +8] (r = lane), for 8 output elements at once."""
    a0 = simd.add(simd.load_f32x8(acc, at + 4 * step), simd.load_f32x8(acc, at))
    a1 = simd.add(simd.load_f32x8(acc, at + 5 * step), simd.load_f32x8(acc, at + step))
    a2 = simd.add(simd.load_f32x8(acc, at + 6 * step), simd.load_f32x8(acc, at + 2 * step))
    a3 = simd.add(simd.load_f32x8(acc, at + 7 * step), simd.load_f32x8(acc, at + 3 * step))
    return simd.add(simd.add(a0, a2), simd.add(a1, a3))


@njit(cache=True, inline="always")
def _reduce_column(acc, at, step, i):
    """(lane 8+i + lane 24+i) + (lane i + lane 16+i) of _reduce_32, 8 output elements at once."""
    return simd.add(simd.add(simd.load_f32x8(acc, at + (8 + i) * step), simd.load_f32x8(acc, at + (24 + i) * step)),
                simd.add(simd.load_f32x8(acc, at + i * step), simd.load_f32x8(acc, at + (16 + i) * step)))


@njit(cache=True, inline="always")
def _reduce_rows(acc, at, step):
    """_reduce_32 across 32 rows acc.flat[at + r*step : +8], for 8 output elements at once."""
    v0 = _reduce_column(acc, at, step, 0)
    v1 = _reduce_column(acc, at, step, 1)
    v2 = _reduce_column(acc, at, step, 2)
    v3 = _reduce_column(acc, at, step, 3)
    v4 = _reduce_column(acc, at, step, 4)
    v5 = _reduce_column(acc, at, step, 5)
    v6 = _reduce_column(acc, at, step, 6)
    v7 = _reduce_column(acc, at, step, 7)
    t0, t1, t2, t3 = simd.add(v4, v0), simd.add(v5, v1), simd.add(v6, v2), simd.add(v7, v3)
    return simd.add(simd.add(t0, t1), simd.add(t2, t3))


# ----------------------------------------------------------------------------- one work item
# An item walks the context in spans of SPAN positions (a multiple of 32, so a position's
# accumulator lane is the same counted from the span start): the span's K (then V) rows are
# converted to float32 once and used by every query head of the group and every query.

SPAN = 64
PREFETCH_SPANS = 2        # KV rows are prefetched this many spans ahead (K spans, then V spans)


@njit(cache=True, inline="always")
def _load_span(cache, table, kv_head, start, rows, span, head_dim):
    """cache rows of positions start..start+rows (via table) for kv_head -> span (SPAN*head_dim,) f32."""
    block_size = cache.shape[1]
    vector_end = head_dim // 8 * 8 if cache.strides[3] == 2 else 0
    b, offset = start // block_size, start % block_size
    block = table[b]
    for o in range(rows):
        at = (block * cache.strides[0] + offset * cache.strides[1] + kv_head * cache.strides[2]) // 2
        for d in range(0, vector_end, 8):
            simd.store_f32x8(span, o * head_dim + d, vec8.load_half(cache, at + d))
        for d in range(vector_end, head_dim):
            span[o * head_dim + d] = _half_to_float(cache[block, offset, kv_head, d])
        offset += 1
        if offset == block_size:
            offset = 0
            b += 1
            if o + 1 < rows:
                block = table[b]


@njit(cache=True, inline="always")
def _prefetch_rows(cache, table, kv_head, start, end, head_dim):
    """Prefetch the cache rows of positions [start, end) for kv_head (every 64-byte line)."""
    block_size = cache.shape[1]
    b, offset = start // block_size, start % block_size
    for p in range(start, end):
        at = (table[b] * cache.strides[0] + offset * cache.strides[1] + kv_head * cache.strides[2]) // 2
        for line in range(0, head_dim * 2, 64):
            vec8.prefetch(cache, at + line // 2)
        if head_dim % 32 != 0:                 # a row that does not fill whole lines may straddle one more
            vec8.prefetch(cache, at + head_dim - 1)
        offset += 1
        if offset == block_size:
            offset = 0
            b += 1


@njit(cache=True, inline="always")
def _scores_64(span, n, queries, at_q, prompt, scale, scores, at_s):
    """head_dim 64: scores[at_s + o] = (span row o . query) * scale for o < n, query kept in registers."""
    q0, q1, q2, q3 = simd.load_f32x8(queries, at_q), simd.load_f32x8(queries, at_q + 8), simd.load_f32x8(queries, at_q + 16), simd.load_f32x8(queries, at_q + 24)
    q4, q5, q6, q7 = simd.load_f32x8(queries, at_q + 32), simd.load_f32x8(queries, at_q + 40), simd.load_f32x8(queries, at_q + 48), \
        simd.load_f32x8(queries, at_q + 56)
    if prompt:
        for o in range(n):
            at = o * 64
            acc = simd.mul(simd.load_f32x8(span, at), q0)
            acc = simd.add(acc, simd.mul(simd.load_f32x8(span, at + 8), q1))
            acc = simd.add(acc, simd.mul(simd.load_f32x8(span, at + 16), q2))
            acc = simd.add(acc, simd.mul(simd.load_f32x8(span, at + 24), q3))
            acc = simd.add(acc, simd.mul(simd.load_f32x8(span, at + 32), q4))
            acc = simd.add(acc, simd.mul(simd.load_f32x8(span, at + 40), q5))
            acc = simd.add(acc, simd.mul(simd.load_f32x8(span, at + 48), q6))
            acc = simd.add(acc, simd.mul(simd.load_f32x8(span, at + 56), q7))
            scores[at_s + o] = vec8.hsum(acc) * scale
    else:
        for o in range(n):
            at = o * 64
            a0 = simd.add(simd.mul(simd.load_f32x8(span, at), q0), simd.mul(simd.load_f32x8(span, at + 32), q4))
            a1 = simd.add(simd.mul(simd.load_f32x8(span, at + 8), q1), simd.mul(simd.load_f32x8(span, at + 40), q5))
            a2 = simd.add(simd.mul(simd.load_f32x8(span, at + 16), q2), simd.mul(simd.load_f32x8(span, at + 48), q6))
            a3 = simd.add(simd.mul(simd.load_f32x8(span, at + 24), q3), simd.mul(simd.load_f32x8(span, at + 56), q7))
            scores[at_s + o] = vec8.reduce32(a0, a1, a2, a3) * scale


@njit(cache=True, inline="always")
def _scores_any(span, n, head_dim, queries, at_q, prompt, scale, scores, at_s):
    """Any head_dim (prompt: a multiple of 8)."""
    for o in range(n):
        if prompt:
            s = _dot_prompt(span, o * head_dim, queries, at_q, head_dim)
        else:
            s = _dot_decode(span, o * head_dim, queries, at_q, head_dim)
        scores[at_s + o] = s * scale


@njit(cache=True, inline="always")
def _weighted_rows(span, n, head_dim, weights, at_w, num_lanes, acc, at_acc):
    """acc lane (o % num_lanes) += weights[at_w + o] * span row o, for o < n, in row order.
    Per 8 output elements and 8 lanes the accumulators stay in registers across the span."""
    vector_end = head_dim // 8 * 8
    for d in range(0, vector_end, 8):
        for first_lane in range(0, min(num_lanes, n), 8):
            at = at_acc + first_lane * head_dim + d
            l0, l1, l2, l3 = simd.load_f32x8(acc, at), simd.load_f32x8(acc, at + head_dim), simd.load_f32x8(acc, at + 2 * head_dim), \
                simd.load_f32x8(acc, at + 3 * head_dim)
            l4, l5, l6, l7 = simd.load_f32x8(acc, at + 4 * head_dim), simd.load_f32x8(acc, at + 5 * head_dim), \
                simd.load_f32x8(acc, at + 6 * head_dim), simd.load_f32x8(acc, at + 7 * head_dim)
            for o in range(first_lane, n, num_lanes):
                row = o * head_dim + d
                if o + 8 <= n:
                    l0 = simd.add(l0, simd.mul(vec8.broadcast(weights, at_w + o), simd.load_f32x8(span, row)))
                    l1 = simd.add(l1, simd.mul(vec8.broadcast(weights, at_w + o + 1), simd.load_f32x8(span, row + head_dim)))
                    l2 = simd.add(l2, simd.mul(vec8.broadcast(weights, at_w + o + 2), simd.load_f32x8(span, row + 2 * head_dim)))
                    l3 = simd.add(l3, simd.mul(vec8.broadcast(weights, at_w + o + 3), simd.load_f32x8(span, row + 3 * head_dim)))
                    l4 = simd.add(l4, simd.mul(vec8.broadcast(weights, at_w + o + 4), simd.load_f32x8(span, row + 4 * head_dim)))
                    l5 = simd.add(l5, simd.mul(vec8.broadcast(weights, at_w + o + 5), simd.load_f32x8(span, row + 5 * head_dim)))
                    l6 = simd.add(l6, simd.mul(vec8.broadcast(weights, at_w + o + 6), simd.load_f32x8(span, row + 6 * head_dim)))
                    l7 = simd.add(l7, simd.mul(vec8.broadcast(weights, at_w + o + 7), simd.load_f32x8(span, row + 7 * head_dim)))
                else:
                    l0 = simd.add(l0, simd.mul(vec8.broadcast(weights, at_w + o), simd.load_f32x8(span, row)))
                    if o + 1 < n:
                        l1 = simd.add(l1, simd.mul(vec8.broadcast(weights, at_w + o + 1), simd.load_f32x8(span, row + head_dim)))
                    if o + 2 < n:
                        l2 = simd.add(l2, simd.mul(vec8.broadcast(weights, at_w + o + 2), simd.load_f32x8(span, row + 2 * head_dim)))
                    if o + 3 < n:
                        l3 = simd.add(l3, simd.mul(vec8.broadcast(weights, at_w + o + 3), simd.load_f32x8(span, row + 3 * head_dim)))
                    if o + 4 < n:
                        l4 = simd.add(l4, simd.mul(vec8.broadcast(weights, at_w + o + 4), simd.load_f32x8(span, row + 4 * head_dim)))
                    if o + 5 < n:
                        l5 = simd.add(l5, simd.mul(vec8.broadcast(weights, at_w + o + 5), simd.load_f32x8(span, row + 5 * head_dim)))
                    if o + 6 < n:
                        l6 = simd.add(l6, simd.mul(vec8.broadcast(weights, at_w + o + 6), simd.load_f32x8(span, row + 6 * head_dim)))
            simd.store_f32x8(acc, at, l0)
            simd.store_f32x8(acc, at + head_dim, l1)
            simd.store_f32x8(acc, at + 2 * head_dim, l2)
            simd.store_f32x8(acc, at + 3 * head_dim, l3)
            simd.store_f32x8(acc, at + 4 * head_dim, l4)
            simd.store_f32x8(acc, at + 5 * head_dim, l5)
            simd.store_f32x8(acc, at + 6 * head_dim, l6)
            simd.store_f32x8(acc, at + 7 * head_dim, l7)
    lane_mask = num_lanes - 1
    for o in range(n):
        weight = weights[at_w + o]
        at = at_acc + (o & lane_mask) * head_dim
        for d in range(vector_end, head_dim):
            acc[at + d] += weight * span[o * head_dim + d]


@njit(cache=True)
def _work_size(group, head_dim, max_context):
    """Float32 scratch one item needs (see _attend_body) for contexts up to max_context."""
    width = (max_context + 7) // 8 * 8
    chunk = max(PROMPT_CHUNK, DECODE_CHUNK)
    return chunk * group * (head_dim + width) + PROMPT_CHUNK * PROMPT_LANES * group * head_dim \
        + SPAN * head_dim + head_dim


@njit(cache=True)
def _attend(q, k_cache, v_cache, table, first_token, count, token_context, kv_head, prompt, scale, out, work):
    """Queries first_token..+count (one sequence, one order) x one kv_head -> out; q rounded in place.
    work: float32 scratch of _work_size elements."""
    if q.shape[2] == 64:             # a literal: the inlined copy has constant offsets
        _attend_body(q, k_cache, v_cache, table, first_token, count, token_context, kv_head, prompt, scale, out,
                     work, 64)
    else:
        _attend_body(q, k_cache, v_cache, table, first_token, count, token_context, kv_head, prompt, scale, out,
                     work, q.shape[2])


@njit(cache=True, inline="always")
def _attend_body(q, k_cache, v_cache, table, first_token, count, token_context, kv_head, prompt, scale, out,
                 work, head_dim):
    group = q.shape[1] // k_cache.shape[2]
    qk_prompt = prompt and head_dim % PROMPT_LANES == 0
    pv_prompt = prompt and head_dim % 4 == 0
    num_lanes = PROMPT_LANES if pv_prompt else DECODE_LANES
    vector_end = head_dim // 8 * 8
    max_context = 0
    for m in range(count):
        max_context = max(max_context, token_context[first_token + m])
    width = (max_context + 7) // 8 * 8
    # scratch, flat: queries (count, group, head_dim), scores (count, group, width),
    # acc (count, group, num_lanes, head_dim), span (SPAN, head_dim)
    end = count * group * head_dim
    queries = work[:end]
    scores = work[end:end + count * group * width]
    end += count * group * width
    acc = work[end:end + count * group * num_lanes * head_dim]
    end += count * group * num_lanes * head_dim
    span = work[end:end + SPAN * head_dim]
    result = work[end + SPAN * head_dim:end + SPAN * head_dim + head_dim]
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
    num_spans = (max_context + SPAN - 1) // SPAN
    for start in range(0, max_context, SPAN):
        rows = min(SPAN, max_context - start)
        # rows PREFETCH_SPANS spans ahead (after the last K span: the first V spans) load while
        # this span computes
        ahead = start + PREFETCH_SPANS * SPAN
        if ahead < max_context:
            _prefetch_rows(k_cache, table, kv_head, ahead, min(ahead + SPAN, max_context), head_dim)
        elif ahead - num_spans * SPAN < max_context:
            ahead -= num_spans * SPAN
            _prefetch_rows(v_cache, table, kv_head, ahead, min(ahead + SPAN, max_context), head_dim)
        _load_span(k_cache, table, kv_head, start, rows, span, head_dim)
        for m in range(count):
            n = min(rows, token_context[first_token + m] - start)
            for g in range(group):
                at_q = (m * group + g) * head_dim
                at_s = (m * group + g) * width + start
                if head_dim == 64:
                    _scores_64(span, n, queries, at_q, qk_prompt, scale, scores, at_s)
                else:
                    _scores_any(span, n, head_dim, queries, at_q, qk_prompt, scale, scores, at_s)
    # softmax: vector exp, float32 sums of 8 aligned positions accumulated in float64
    for m in range(count):
        context = token_context[first_token + m]
        full = context // 8 * 8
        for g in range(group):
            at = (m * group + g) * width
            peak = np.float32(-np.inf)
            if full > 0:
                best = simd.load_f32x8(scores, at)
                for s in range(8, full, 8):
                    best = vec8.maximum(best, simd.load_f32x8(scores, at + s))
                peak = vec8.max_lane(best)
            for p in range(full, context):
                peak = max(peak, scores[at + p])
            top = simd.splat_f32(peak)
            total = 0.0
            for s in range(0, full, 8):
                e = vec8.exp(vec8.sub(simd.load_f32x8(scores, at + s), top))
                simd.store_f32x8(scores, at + s, e)
                total += np.float64(vec8.hsum(e))
            if full < context:                   # last group: positions past the context are 0
                e = vec8.keep_first(vec8.exp(vec8.sub(simd.load_f32x8(scores, at + full), top)), context - full)
                simd.store_f32x8(scores, at + full, e)
                total += np.float64(vec8.hsum(e))
            inverse = simd.splat_f32(np.float32(1.0 / total))
            for s in range(0, context, 8):
                simd.store_f32x8(scores, at + s, vec8.round_half(simd.mul(simd.load_f32x8(scores, at + s), inverse)))
    # out = P . V: lane p % num_lanes of each output element sums its positions in order
    for start in range(0, max_context, SPAN):
        rows = min(SPAN, max_context - start)
        ahead = start + PREFETCH_SPANS * SPAN
        if ahead < max_context:
            _prefetch_rows(v_cache, table, kv_head, ahead, min(ahead + SPAN, max_context), head_dim)
        _load_span(v_cache, table, kv_head, start, rows, span, head_dim)
        for m in range(count):
            n = min(rows, token_context[first_token + m] - start)
            if n <= 0:
                continue
            for g in range(group):
                at_w, at_acc = (m * group + g) * width + start, (m * group + g) * num_lanes * head_dim
                _weighted_rows(span, n, head_dim, scores, at_w, num_lanes, acc, at_acc)
    for m in range(count):
        t = first_token + m
        for g in range(group):
            at = (m * group + g) * num_lanes * head_dim
            for d in range(0, vector_end, 8):
                if pv_prompt:
                    simd.store_f32x8(result, d, _hsum_rows(acc, at + d, head_dim))
                else:
                    simd.store_f32x8(result, d, _reduce_rows(acc, at + d, head_dim))
            for d in range(vector_end, head_dim):
                if pv_prompt:
                    lanes = acc[at + d:at + d + 8 * head_dim:head_dim]
                    a0 = lanes[4] + lanes[0]
                    a1 = lanes[5] + lanes[1]
                    a2 = lanes[6] + lanes[2]
                    a3 = lanes[7] + lanes[3]
                    result[d] = (a0 + a2) + (a1 + a3)
                else:
                    result[d] = _reduce_32(acc[at + d:at + d + 32 * head_dim:head_dim], 0)
            h = kv_head * group + g
            for d in range(head_dim):
                out[t, h, d] = result[d]


# ------------------------------------------------------------------------------- drivers

@njit(cache=True)
def _chunks(token_seq, batched, head_dim):
    """Consecutive tokens of one sequence and one order -> (first token, count) per chunk."""
    num_tokens = token_seq.shape[0]
    firsts = np.empty(num_tokens, np.int64)
    counts = np.empty(num_tokens, np.int64)
    n = 0
    t = 0
    while t < num_tokens:
        prompt = batched[t] != 0
        limit = PROMPT_CHUNK if prompt and head_dim % 4 == 0 else DECODE_CHUNK
        c = 1
        while c < limit and t + c < num_tokens and token_seq[t + c] == token_seq[t] \
                and (batched[t + c] != 0) == prompt:
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
def _prefetch_item(i, num_items, firsts, counts, k_cache, v_cache, block_tables, token_seq, token_context):
    """Start loading item i's K and V rows into L2 (KV comes from memory in a real forward pass)."""
    c, kv_head = _item(i, num_items, k_cache.shape[2])
    first = firsts[c]
    context = 0
    for t in range(first, first + counts[c]):
        context = max(context, token_context[t])
    table = block_tables[token_seq[first]]
    rows = min(context, PREFETCH_SPANS * SPAN)
    _prefetch_rows(k_cache, table, kv_head, 0, rows, k_cache.shape[3])
    if context < PREFETCH_SPANS * SPAN:       # the first V spans are due soon too
        _prefetch_rows(v_cache, table, kv_head, 0, min(context, PREFETCH_SPANS * SPAN - rows), v_cache.shape[3])


@njit(cache=True, inline="always")
def _run_item(i, num_items, firsts, counts, q, k_cache, v_cache, block_tables, token_seq, token_context,
              batched, scale, out, work):
    if i + 1 < num_items:           # the next item's KV loads while this one computes
        _prefetch_item(i + 1, num_items, firsts, counts, k_cache, v_cache, block_tables, token_seq, token_context)
    c, kv_head = _item(i, num_items, k_cache.shape[2])
    first = firsts[c]
    _attend(q, k_cache, v_cache, block_tables[token_seq[first]], first, counts[c], token_context, kv_head,
            batched[first] != 0, scale, out, work)


@njit(cache=True, nogil=True)
def paged_attention_serial(q, k_cache, v_cache, block_tables, token_seq, token_context, batched, scale, out, work):
    """paged_attention on the calling thread only (uses work[0])."""
    firsts, counts = _chunks(token_seq, batched, q.shape[2])
    num_items = firsts.shape[0] * k_cache.shape[2]
    if num_items == 0:
        return
    _prefetch_item(0, num_items, firsts, counts, k_cache, v_cache, block_tables, token_seq, token_context)
    for i in range(num_items):
        _run_item(i, num_items, firsts, counts, q, k_cache, v_cache, block_tables, token_seq, token_context,
                  batched, scale, out, work[0])


@njit(parallel=True, cache=True)
def paged_attention_parallel(q, k_cache, v_cache, block_tables, token_seq, token_context, batched, scale, out, work):
    """paged_attention with its work items on numba's thread pool (work row per thread)."""
    firsts, counts = _chunks(token_seq, batched, q.shape[2])
    num_items = firsts.shape[0] * k_cache.shape[2]
    if num_items == 0:
        return
    for i in prange(num_items):
        # which items a thread gets is up to the scheduler: each item also prefetches its own rows
        _prefetch_item(i, num_items, firsts, counts, k_cache, v_cache, block_tables, token_seq, token_context)
        _run_item(i, num_items, firsts, counts, q, k_cache, v_cache, block_tables, token_seq, token_context,
                  batched, scale, out, work[numba.get_thread_id()])


def attention_work(num_heads: int, kv_heads: int, head_dim: int, max_context: int) -> np.ndarray:
    """Scratch for paged_attention over contexts up to max_context: one float32 row per numba thread."""
    work = np.empty((numba.config.NUMBA_NUM_THREADS, _work_size(num_heads // kv_heads, head_dim, max_context)),
                    np.float32)
    work.fill(0)          # touched now: the part a context reaches first would page-fault mid-decode
    return work


def check_work(work: np.ndarray, num_heads: int, kv_heads: int, head_dim: int, context: int) -> None:
    """ValueError unless work (from attention_work) is big enough for contexts up to `context`."""
    if work.shape[1] < _work_size(num_heads // kv_heads, head_dim, context):
        raise ValueError(f"attention work buffer too small for a context of {context}")


def paged_attention(q, k_cache, v_cache, block_tables, token_seq, token_context, batched, scale, out,
                    work=None, parallel=None):
    """q (T, heads, head_dim) f32; token t attends to positions [0, token_context[t]) of sequence
    token_seq[t] via block_tables (S, max_blocks), in prompt order if batched[t] (T,) is nonzero
    -> out (T, heads, head_dim) f32. q is rounded to fp16 in place.
    work: attention_work(...) for at least max(token_context) (allocated per call if None).
    parallel: None = thread pool only when the call is big enough to repay waking it, or force True/False.
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
    kernel = paged_attention_parallel if parallel else paged_attention_serial
    kernel(q, k_cache, v_cache, block_tables, token_seq, token_context, batched, scale, out, work)


# --------------------------------------------------------------------------------- KV writes

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
