"""Paged-attention arithmetic in llama.cpp's summation orders (kernels/attention.py says which):
fp16 dot products, the lane reductions, KV spans loaded as float32, scores and weighted rows.
Every function works on flat float32 scratch with explicit offsets (no allocation)."""
import numpy as np
from numba import njit

from . import simd, vec8
from .half import half_to_float
from .ops import hsum8

DECODE_LANES = 32
PROMPT_LANES = 8
# An item walks the context in spans of SPAN positions (a multiple of 32, so a position's
# accumulator lane is the same counted from the span start): the span's K (then V) rows are
# converted to float32 once and used by every query head of the group and every query.
SPAN = 64
PREFETCH_SPANS = 2        # KV rows are prefetched this many spans ahead (K spans, then V spans)


@njit(cache=True, inline="always")
def reduce_32(lanes, at):
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
def dot_f16(a, b, prompt_order, lanes):
    """a . b for fp16-valued float32 vectors of one length, in llama.cpp's order; lanes: 32 f32 scratch.
    (Scalar statement of the two orders; the kernels use the vector forms `dot_prompt`/`dot_decode`.)"""
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
        total = np.float64(reduce_32(lanes, 0))
    for i in range(vector_end, n):                  # ggml adds the rest in float64
        total += np.float64(a[i] * b[i])
    return np.float32(total)


@njit(cache=True, inline="always")
def dot_prompt(k, at_k, q, at_q, n):
    """k.flat[at_k:at_k+n] . q.flat[at_q:at_q+n], n a multiple of 8, tinyBLAS order (8 lanes, hsum8)."""
    acc = simd.mul(simd.load_f32x8(k, at_k), simd.load_f32x8(q, at_q))
    for s in range(8, n, 8):
        acc = simd.add(acc, simd.mul(simd.load_f32x8(k, at_k + s), simd.load_f32x8(q, at_q + s)))
    return vec8.hsum(acc)


@njit(cache=True, inline="always")
def dot_decode(k, at_k, q, at_q, n):
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
def hsum_rows(acc, at, step):
    """hsum8 across 8 rows acc.flat[at + r*step : +8] (r = lane), for 8 output elements at once."""
    a0 = simd.add(simd.load_f32x8(acc, at + 4 * step), simd.load_f32x8(acc, at))
    a1 = simd.add(simd.load_f32x8(acc, at + 5 * step), simd.load_f32x8(acc, at + step))
    a2 = simd.add(simd.load_f32x8(acc, at + 6 * step), simd.load_f32x8(acc, at + 2 * step))
    a3 = simd.add(simd.load_f32x8(acc, at + 7 * step), simd.load_f32x8(acc, at + 3 * step))
    return simd.add(simd.add(a0, a2), simd.add(a1, a3))


@njit(cache=True, inline="always")
def reduce_column(acc, at, step, i):
    """(lane 8+i + lane 24+i) + (lane i + lane 16+i) of reduce_32, 8 output elements at once."""
    return simd.add(simd.add(simd.load_f32x8(acc, at + (8 + i) * step), simd.load_f32x8(acc, at + (24 + i) * step)),
                simd.add(simd.load_f32x8(acc, at + i * step), simd.load_f32x8(acc, at + (16 + i) * step)))


@njit(cache=True, inline="always")
def reduce_rows(acc, at, step):
    """reduce_32 across 32 rows acc.flat[at + r*step : +8], for 8 output elements at once."""
    v0 = reduce_column(acc, at, step, 0)
    v1 = reduce_column(acc, at, step, 1)
    v2 = reduce_column(acc, at, step, 2)
    v3 = reduce_column(acc, at, step, 3)
    v4 = reduce_column(acc, at, step, 4)
    v5 = reduce_column(acc, at, step, 5)
    v6 = reduce_column(acc, at, step, 6)
    v7 = reduce_column(acc, at, step, 7)
    t0, t1, t2, t3 = simd.add(v4, v0), simd.add(v5, v1), simd.add(v6, v2), simd.add(v7, v3)
    return simd.add(simd.add(t0, t1), simd.add(t2, t3))


# ----------------------------------------------------------------------------- KV spans



@njit(cache=True, inline="always")
def load_span(cache, table, kv_head, start, rows, span, head_dim):
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
            span[o * head_dim + d] = half_to_float(cache[block, offset, kv_head, d])
        offset += 1
        if offset == block_size:
            offset = 0
            b += 1
            if o + 1 < rows:
                block = table[b]


@njit(cache=True, inline="always")
def prefetch_rows(cache, table, kv_head, start, end, head_dim):
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
def scores_64(span, n, queries, at_q, prompt, scale, scores, at_s):
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
def scores_any(span, n, head_dim, queries, at_q, prompt, scale, scores, at_s):
    """Any head_dim (prompt: a multiple of 8)."""
    for o in range(n):
        if prompt:
            s = dot_prompt(span, o * head_dim, queries, at_q, head_dim)
        else:
            s = dot_decode(span, o * head_dim, queries, at_q, head_dim)
        scores[at_s + o] = s * scale


@njit(cache=True, inline="always")
def weighted_rows(span, n, head_dim, weights, at_w, num_lanes, acc, at_acc):
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
