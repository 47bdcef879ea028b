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
# llama.cpp's AVX-512 build: ggml_vec_dot_f16 keeps 4 vectors x 16 lanes, tinyBLAS 16 lanes.
WIDE_DECODE_LANES = 64
WIDE_PROMPT_LANES = 16
# An item walks the context in spans of SPAN positions (a multiple of 32, so a position's
# accumulator lane is the same counted from the span start): the span's K (then V) rows are
# converted to float32 once and used by every query head of the group and every query.
SPAN = 64
PREFETCH_SPANS = 2        # KV rows are prefetched this many spans ahead (K spans, then V spans)
LANE_ROWS = 16            # a decode-order P . V by lane converts a lane's V rows this many at a time
# ... and goes by lane when its lanes get at least this many rows each (with fewer, converting
# and summing position by position is faster: 0.9x at ~1.5 rows a lane, 1.2-1.4x from ~2.3)
MIN_ROWS_BY_LANE = 2
# The AVX-512 decode order keeps a P . V's 64 lanes in registers (lane_sums_wide) when its V rows
# (converted to float32 at once) are at most this many; beyond, going by lane is faster (their
# 64 KiB or more no longer stay in L1 while every 16 output elements pass over them again).
VALUE_ROWS = 256
# ... stored VALUE_PAD floats apart beyond head_dim: at a power-of-two stride the rows that one
# pass reads (8 rows apart) fall into the same few L1 sets and evict each other
VALUE_PAD = 16
# lane_sums_wide's scratch after its results: 16 output elements of each of its 8 lane groups, for
# each of up to 3 query heads
LANE_SUMS_SCRATCH = 3 * 8 * 16


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
def reduce_16(lanes, at):
    """Sum of lanes[at:at+16] as _mm512_reduce_add_ps: hsum_float_8 of (lanes 8..15 + lanes 0..7)."""
    a0 = lanes[at + 8] + lanes[at]
    a1 = lanes[at + 9] + lanes[at + 1]
    a2 = lanes[at + 10] + lanes[at + 2]
    a3 = lanes[at + 11] + lanes[at + 3]
    a4 = lanes[at + 12] + lanes[at + 4]
    a5 = lanes[at + 13] + lanes[at + 5]
    a6 = lanes[at + 14] + lanes[at + 6]
    a7 = lanes[at + 15] + lanes[at + 7]
    return ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3))


@njit(cache=True, inline="always")
def reduce_64(lanes, at):
    """Sum of lanes[at:at+64] in the AVX-512 ggml_vec_dot_f16's order (lane 16*j + i = vector j,
    element i): (v0 + v2) + (v1 + v3) element-wise, then reduce_16. lanes[at:at+16] is overwritten."""
    for i in range(16):
        lanes[at + i] = (lanes[at + i] + lanes[at + 32 + i]) + (lanes[at + 16 + i] + lanes[at + 48 + i])
    return reduce_16(lanes, at)


# 16-lane vectors (the AVX-512 build's width) as two F32x8 halves joined: LLVM emits one 512-bit
# load, store or operation for each where the CPU has AVX-512, two 256-bit ones elsewhere.

@njit(cache=True, inline="always")
def load16(arr, at):
    """arr[at:at+16] of a contiguous float32 array -> F32x16."""
    return simd.concat(simd.load_f32x8(arr, at), simd.load_f32x8(arr, at + 8))


@njit(cache=True, inline="always")
def store16(arr, at, v):
    """arr[at:at+16] = v (F32x16)."""
    simd.store_f32x8(arr, at, simd.low_half(v))
    simd.store_f32x8(arr, at + 8, simd.high_half(v))


@njit(cache=True, inline="always")
def broadcast16(arr, at):
    """arr[at] (contiguous float32), 16 copies -> F32x16."""
    one = vec8.broadcast(arr, at)
    return simd.concat(one, one)


@njit(cache=True, inline="always")
def zeros16():
    """16 float32 zeros (F32x16)."""
    zero = simd.zeros_f32x8()
    return simd.concat(zero, zero)


@njit(cache=True, inline="always")
def load_half16(cache, at):
    """16 fp16 bit patterns at cache.data[at:at+16] -> F32x16, as vec8.load_half."""
    return simd.concat(vec8.load_half(cache, at), vec8.load_half(cache, at + 8))


@njit(cache=True, inline="always")
def reduce16(v):
    """Sum of the 16 lanes in reduce_16's order (_mm512_reduce_add_ps) -> float32."""
    return vec8.hsum(simd.add(simd.high_half(v), simd.low_half(v)))


@njit(cache=True, inline="always")
def dot_f16(a, b, prompt_order, lanes, avx512=False):
    """a . b for fp16-valued float32 vectors of one length, in llama.cpp's order; lanes: 32 f32 scratch.
    (Scalar statement of the orders; the kernels use the vector forms `dot_prompt`/`dot_decode`.)
    avx512: the AVX-512 build's orders (16 and 64 lanes, reduce_16 / reduce_64; lanes: 64 f32)."""
    n = a.shape[0]
    prompt_lanes = WIDE_PROMPT_LANES if avx512 else PROMPT_LANES
    decode_lanes = WIDE_DECODE_LANES if avx512 else DECODE_LANES
    if prompt_order:
        for i in range(prompt_lanes):
            lanes[i] = a[i] * b[i]
        for s in range(prompt_lanes, n, prompt_lanes):
            for i in range(prompt_lanes):
                lanes[i] += a[s + i] * b[s + i]
        return reduce_16(lanes, 0) if avx512 else hsum8(lanes, 0)
    vector_end = n // decode_lanes * decode_lanes
    total = 0.0
    if vector_end > 0:
        for i in range(decode_lanes):
            lanes[i] = a[i] * b[i]
        for s in range(decode_lanes, vector_end, decode_lanes):
            for i in range(decode_lanes):
                lanes[i] += a[s + i] * b[s + i]
        total = np.float64(reduce_64(lanes, 0) if avx512 else reduce_32(lanes, 0))
    for i in range(vector_end, n):                  # ggml adds the rest in float64
        total += np.float64(a[i] * b[i])
    return np.float32(total)


@njit(cache=True, inline="always")
def dot_prompt(k, at_k, q, at_q, n):
    """k.flat[at_k:at_k+n] . q.flat[at_q:at_q+n], n a multiple of 8, tinyBLAS order (8 lanes, hsum8)."""
    acc = simd.mul(simd.load_f32x8(k, at_k), simd.load_f32x8(q, at_q))
    for s in range(8, n, 8):
        acc = simd.add_exact_product(simd.load_f32x8(k, at_k + s), simd.load_f32x8(q, at_q + s), acc)
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
            a0 = simd.add_exact_product(simd.load_f32x8(k, at_k + s), simd.load_f32x8(q, at_q + s), a0)
            a1 = simd.add_exact_product(simd.load_f32x8(k, at_k + s + 8), simd.load_f32x8(q, at_q + s + 8), a1)
            a2 = simd.add_exact_product(simd.load_f32x8(k, at_k + s + 16), simd.load_f32x8(q, at_q + s + 16), a2)
            a3 = simd.add_exact_product(simd.load_f32x8(k, at_k + s + 24), simd.load_f32x8(q, at_q + s + 24), a3)
        total = np.float64(vec8.reduce32(a0, a1, a2, a3))
    for i in range(vector_end, n):
        total += np.float64(k[at_k + i] * q[at_q + i])
    return np.float32(total)


@njit(cache=True, inline="always")
def dot_prompt_wide(k, at_k, q, at_q, n):
    """dot_prompt in the AVX-512 tinyBLAS order: n a multiple of 16, 16 lanes (two F32x8), reduce_16."""
    low = simd.mul(simd.load_f32x8(k, at_k), simd.load_f32x8(q, at_q))
    high = simd.mul(simd.load_f32x8(k, at_k + 8), simd.load_f32x8(q, at_q + 8))
    for s in range(16, n, 16):
        low = simd.add_exact_product(simd.load_f32x8(k, at_k + s), simd.load_f32x8(q, at_q + s), low)
        high = simd.add_exact_product(simd.load_f32x8(k, at_k + s + 8), simd.load_f32x8(q, at_q + s + 8), high)
    return vec8.hsum(simd.add(high, low))


@njit(cache=True, inline="always")
def _products(k, at_k, q, at_q, s):
    return simd.mul(simd.load_f32x8(k, at_k + s), simd.load_f32x8(q, at_q + s))


@njit(cache=True, inline="always")
def _plus_products(k, at_k, q, at_q, s, lanes):
    return simd.add_exact_product(simd.load_f32x8(k, at_k + s), simd.load_f32x8(q, at_q + s), lanes)


@njit(cache=True, inline="always")
def dot_decode_wide(k, at_k, q, at_q, n):
    """dot_decode in the AVX-512 ggml_vec_dot_f16's order (64 lanes as 8 F32x8: chunk c of each 64
    elements is half c % 2 of vector c // 2; reduce_64; the rest in float64)."""
    vector_end = n // WIDE_DECODE_LANES * WIDE_DECODE_LANES
    total = 0.0
    if vector_end > 0:
        c0, c1, c2, c3 = _products(k, at_k, q, at_q, 0), _products(k, at_k, q, at_q, 8), \
            _products(k, at_k, q, at_q, 16), _products(k, at_k, q, at_q, 24)
        c4, c5, c6, c7 = _products(k, at_k, q, at_q, 32), _products(k, at_k, q, at_q, 40), \
            _products(k, at_k, q, at_q, 48), _products(k, at_k, q, at_q, 56)
        for s in range(64, vector_end, 64):
            c0, c1 = _plus_products(k, at_k, q, at_q, s, c0), _plus_products(k, at_k, q, at_q, s + 8, c1)
            c2, c3 = _plus_products(k, at_k, q, at_q, s + 16, c2), _plus_products(k, at_k, q, at_q, s + 24, c3)
            c4, c5 = _plus_products(k, at_k, q, at_q, s + 32, c4), _plus_products(k, at_k, q, at_q, s + 40, c5)
            c6, c7 = _plus_products(k, at_k, q, at_q, s + 48, c6), _plus_products(k, at_k, q, at_q, s + 56, c7)
        total = np.float64(reduce_64_vectors(c0, c1, c2, c3, c4, c5, c6, c7))
    for i in range(vector_end, n):
        total += np.float64(k[at_k + i] * q[at_q + i])
    return np.float32(total)


@njit(cache=True, inline="always")
def reduce_64_vectors(c0, c1, c2, c3, c4, c5, c6, c7):
    """reduce_64 of 64 lanes held as 8 F32x8 (c0, c1 = vector 0's low and high halves, ...)."""
    low = simd.add(simd.add(c0, c4), simd.add(c2, c6))
    high = simd.add(simd.add(c1, c5), simd.add(c3, c7))
    return vec8.hsum(simd.add(high, low))


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


@njit(cache=True, inline="always")
def _row(acc, at, step, r):
    return simd.load_f32x8(acc, at + r * step)


@njit(cache=True, inline="always")
def reduce_16_rows(acc, at, step):
    """reduce_16 across 16 rows acc.flat[at + r*step : +8], for 8 output elements at once."""
    a0 = simd.add(_row(acc, at, step, 8), _row(acc, at, step, 0))
    a1 = simd.add(_row(acc, at, step, 9), _row(acc, at, step, 1))
    a2 = simd.add(_row(acc, at, step, 10), _row(acc, at, step, 2))
    a3 = simd.add(_row(acc, at, step, 11), _row(acc, at, step, 3))
    a4 = simd.add(_row(acc, at, step, 12), _row(acc, at, step, 4))
    a5 = simd.add(_row(acc, at, step, 13), _row(acc, at, step, 5))
    a6 = simd.add(_row(acc, at, step, 14), _row(acc, at, step, 6))
    a7 = simd.add(_row(acc, at, step, 15), _row(acc, at, step, 7))
    return simd.add(simd.add(simd.add(a4, a0), simd.add(a6, a2)), simd.add(simd.add(a5, a1), simd.add(a7, a3)))


@njit(cache=True, inline="always")
def reduce_64_rows(acc, at, step):
    """reduce_64 across 64 rows acc.flat[at + r*step : +8], for 8 output elements at once; rows
    0..15 are overwritten with the element-wise (v0 + v2) + (v1 + v3)."""
    for i in range(16):
        v = simd.add(simd.add(_row(acc, at, step, i), _row(acc, at, step, 32 + i)),
                     simd.add(_row(acc, at, step, 16 + i), _row(acc, at, step, 48 + i)))
        simd.store_f32x8(acc, at + i * step, v)
    return reduce_16_rows(acc, at, step)


# ----------------------------------------------------------------------------- KV spans



@njit(cache=True, inline="always")
def load_span(cache, table, kv_head, start, rows, span, head_dim, row_stride):
    """cache rows of positions start..start+rows (via table) for kv_head -> span f32, row o at
    span[o * row_stride:o * row_stride + head_dim]."""
    block_size = cache.shape[1]
    b, offset = start // block_size, start % block_size
    block = table[b]
    for o in range(rows):
        _convert_row(cache, block, offset, kv_head, span, o * row_stride, head_dim)
        offset += 1
        if offset == block_size:
            offset = 0
            b += 1
            if o + 1 < rows:
                block = table[b]


@njit(cache=True, inline="always")
def load_strided(cache, table, kv_head, first, step, rows, span, head_dim):
    """cache rows of positions first, first + step, ... (rows of them, via table) for kv_head ->
    span (rows*head_dim,) f32."""
    block_size = cache.shape[1]
    for r in range(rows):
        p = first + r * step
        _convert_row(cache, table[p // block_size], p % block_size, kv_head, span, r * head_dim, head_dim)


@njit(cache=True, inline="always")
def _convert_row(cache, block, offset, kv_head, span, at_span, head_dim):
    """cache[block, offset, kv_head] (fp16 bits) -> span[at_span:at_span+head_dim] f32."""
    vector_end = head_dim // 8 * 8 if cache.strides[3] == 2 else 0
    wide_end = vector_end // 16 * 16
    at = (block * cache.strides[0] + offset * cache.strides[1] + kv_head * cache.strides[2]) // 2
    for d in range(0, wide_end, 16):
        store16(span, at_span + d, load_half16(cache, at + d))
    for d in range(wide_end, vector_end, 8):
        simd.store_f32x8(span, at_span + d, vec8.load_half(cache, at + d))
    for d in range(vector_end, head_dim):
        span[at_span + d] = half_to_float(cache[block, offset, kv_head, d])


@njit(cache=True, inline="always")
def prefetch_rows(cache, table, kv_head, start, end, head_dim):
    """Prefetch the cache rows of positions [start, end) for kv_head (every 64-byte line)."""
    block_size = cache.shape[1]
    if cache.strides[1] == head_dim * 2:          # a block's rows of one head are contiguous (KVArena)
        for b in range(start // block_size, (end + block_size - 1) // block_size):
            low = b * block_size
            first, last = max(start, low) - low, min(end, low + block_size) - low
            at = (table[b] * cache.strides[0] + first * cache.strides[1] + kv_head * cache.strides[2]) // 2
            halves = (last - first) * head_dim
            for line in range(0, halves, 32):
                vec8.prefetch(cache, at + line)
            if halves > 0:
                vec8.prefetch(cache, at + halves - 1)      # the last line, when the rows start mid-line
        return
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
            acc = simd.add_exact_product(simd.load_f32x8(span, at + 8), q1, acc)
            acc = simd.add_exact_product(simd.load_f32x8(span, at + 16), q2, acc)
            acc = simd.add_exact_product(simd.load_f32x8(span, at + 24), q3, acc)
            acc = simd.add_exact_product(simd.load_f32x8(span, at + 32), q4, acc)
            acc = simd.add_exact_product(simd.load_f32x8(span, at + 40), q5, acc)
            acc = simd.add_exact_product(simd.load_f32x8(span, at + 48), q6, acc)
            acc = simd.add_exact_product(simd.load_f32x8(span, at + 56), q7, acc)
            scores[at_s + o] = vec8.hsum(acc) * scale
    else:
        for o in range(n):
            at = o * 64
            a0 = simd.add_exact_product(simd.load_f32x8(span, at), q0, simd.mul(simd.load_f32x8(span, at + 32), q4))
            a1 = simd.add_exact_product(simd.load_f32x8(span, at + 8), q1, simd.mul(simd.load_f32x8(span, at + 40), q5))
            a2 = simd.add_exact_product(simd.load_f32x8(span, at + 16), q2, simd.mul(simd.load_f32x8(span, at + 48), q6))
            a3 = simd.add_exact_product(simd.load_f32x8(span, at + 24), q3, simd.mul(simd.load_f32x8(span, at + 56), q7))
            scores[at_s + o] = vec8.reduce32(a0, a1, a2, a3) * scale


@njit(cache=True, inline="always")
def scores_64_wide(span, n, queries, at_q, prompt, scale, scores, at_s):
    """scores_64 in the AVX-512 build's orders on 16-lane vectors (prompt: lane i sums elements
    i, i+16, i+32, i+48 in turn; decode: 64 lanes, one step, reduce_64), query in registers."""
    q0, q1, q2, q3 = load16(queries, at_q), load16(queries, at_q + 16), load16(queries, at_q + 32), \
        load16(queries, at_q + 48)
    for o in range(n):
        at = o * 64
        k0, k1, k2, k3 = load16(span, at), load16(span, at + 16), load16(span, at + 32), load16(span, at + 48)
        if prompt:
            lanes = simd.add_exact_product(k1, q1, simd.mul(k0, q0))
            lanes = simd.add_exact_product(k3, q3, simd.add_exact_product(k2, q2, lanes))
        else:           # (v0 + v2) + (v1 + v3), lane by lane
            lanes = simd.add(simd.add_exact_product(k0, q0, simd.mul(k2, q2)),
                             simd.add_exact_product(k1, q1, simd.mul(k3, q3)))
        scores[at_s + o] = reduce16(lanes) * scale


@njit(cache=True, inline="always")
def scores_64_three(span, n, queries, at_q, prompt, scale, scores, at_s, width):
    """scores_64_wide for 3 query heads at once (queries at at_q, +64, +128; scores at at_s, +width,
    +2 * width): each K row is loaded once for the three, and 16 positions' lanes are reduced together
    by vec8's fold network instead of one reduce16 each."""
    q = (load16(queries, at_q), load16(queries, at_q + 16), load16(queries, at_q + 32),
         load16(queries, at_q + 48), load16(queries, at_q + 64), load16(queries, at_q + 80),
         load16(queries, at_q + 96), load16(queries, at_q + 112), load16(queries, at_q + 128),
         load16(queries, at_q + 144), load16(queries, at_q + 160), load16(queries, at_q + 176))
    scale16 = simd.concat(simd.splat_f32(scale), simd.splat_f32(scale))
    full = max(n, 0) // 16 * 16        # n <= 0: a query of a prompt chunk whose context ends before the span
    for o in range(0, full, 16):
        s0, s1, s2 = _scores16_three(span, o * 64, q, prompt)
        store16(scores, at_s + o, simd.mul(s0, scale16))
        store16(scores, at_s + width + o, simd.mul(s1, scale16))
        store16(scores, at_s + 2 * width + o, simd.mul(s2, scale16))
    for o in range(full, n):
        l0, l1, l2 = _key_lanes_three(span, o * 64, q, prompt)
        scores[at_s + o] = reduce16(l0) * scale
        scores[at_s + width + o] = reduce16(l1) * scale
        scores[at_s + 2 * width + o] = reduce16(l2) * scale


@njit(cache=True, inline="always")
def _key_lanes(k0, k1, k2, k3, q0, q1, q2, q3, prompt):
    """The 16 lanes of scores_64_wide's dot before reduce16 (prompt: the tinyBLAS order)."""
    if prompt:
        return simd.add_exact_product(k3, q3, simd.add_exact_product(k2, q2, simd.add_exact_product(k1, q1,
                                                                                                    simd.mul(k0, q0))))
    return simd.add(simd.add_exact_product(k0, q0, simd.mul(k2, q2)), simd.add_exact_product(k1, q1, simd.mul(k3, q3)))


@njit(cache=True, inline="always")
def _key_lanes_three(span, at, q, prompt):
    """K row at span[at:at+64] . the three queries q (4 vectors each) -> their 16 lanes each."""
    k0, k1, k2, k3 = load16(span, at), load16(span, at + 16), load16(span, at + 32), load16(span, at + 48)
    return (_key_lanes(k0, k1, k2, k3, q[0], q[1], q[2], q[3], prompt),
            _key_lanes(k0, k1, k2, k3, q[4], q[5], q[6], q[7], prompt),
            _key_lanes(k0, k1, k2, k3, q[8], q[9], q[10], q[11], prompt))


@njit(cache=True, inline="always")
def _leaf_pair_three(span, at, a, b, q, prompt):
    """Rows a and b (positions from `at`), fold_8 of their lanes, for each head."""
    x0, x1, x2 = _key_lanes_three(span, at + a * 64, q, prompt)
    y0, y1, y2 = _key_lanes_three(span, at + b * 64, q, prompt)
    return vec8.fold_8(x0, y0), vec8.fold_8(x1, y1), vec8.fold_8(x2, y2)


@njit(cache=True, inline="always")
def _leaf_quad_three(span, at, a, b, c, d, q, prompt):
    x0, x1, x2 = _leaf_pair_three(span, at, a, b, q, prompt)
    y0, y1, y2 = _leaf_pair_three(span, at, c, d, q, prompt)
    return vec8.fold_4(x0, y0), vec8.fold_4(x1, y1), vec8.fold_4(x2, y2)


@njit(cache=True, inline="always")
def _scores16_three(span, at, q, prompt):
    """The dots of 16 K rows from span[at:] with three queries -> an F32x16 of them per head, in
    position order (the leaves in vec8.FOLD_LEAF_ORDER: 0, 4, 8, 12, 1, 5, ...)."""
    a0, a1, a2 = _leaf_quad_three(span, at, 0, 4, 8, 12, q, prompt)
    b0, b1, b2 = _leaf_quad_three(span, at, 1, 5, 9, 13, q, prompt)
    e0, e1, e2 = vec8.fold_2(a0, b0), vec8.fold_2(a1, b1), vec8.fold_2(a2, b2)
    a0, a1, a2 = _leaf_quad_three(span, at, 2, 6, 10, 14, q, prompt)
    b0, b1, b2 = _leaf_quad_three(span, at, 3, 7, 11, 15, q, prompt)
    return vec8.fold_1(e0, vec8.fold_2(a0, b0)), vec8.fold_1(e1, vec8.fold_2(a1, b1)), \
        vec8.fold_1(e2, vec8.fold_2(a2, b2))


@njit(cache=True, inline="always")
def scores_128_wide(span, n, queries, at_q, prompt, scale, scores, at_s):
    """head_dim 128, the AVX-512 build's orders (dot_prompt_wide, dot_decode_wide) on 16-lane
    vectors, query in registers."""
    q0, q1, q2, q3 = load16(queries, at_q), load16(queries, at_q + 16), load16(queries, at_q + 32), \
        load16(queries, at_q + 48)
    q4, q5, q6, q7 = load16(queries, at_q + 64), load16(queries, at_q + 80), load16(queries, at_q + 96), \
        load16(queries, at_q + 112)
    for o in range(n):
        at = o * 128
        if prompt:      # 16 lanes over 8 steps
            lanes = _plus_key16(span, at + 16, q1, simd.mul(load16(span, at), q0))
            lanes = _plus_key16(span, at + 48, q3, _plus_key16(span, at + 32, q2, lanes))
            lanes = _plus_key16(span, at + 80, q5, _plus_key16(span, at + 64, q4, lanes))
            lanes = _plus_key16(span, at + 112, q7, _plus_key16(span, at + 96, q6, lanes))
        else:           # 64 lanes over 2 steps, then reduce_64's (v0 + v2) + (v1 + v3)
            v0 = _plus_key16(span, at + 64, q4, simd.mul(load16(span, at), q0))
            v1 = _plus_key16(span, at + 80, q5, simd.mul(load16(span, at + 16), q1))
            v2 = _plus_key16(span, at + 96, q6, simd.mul(load16(span, at + 32), q2))
            v3 = _plus_key16(span, at + 112, q7, simd.mul(load16(span, at + 48), q3))
            lanes = simd.add(simd.add(v0, v2), simd.add(v1, v3))
        scores[at_s + o] = reduce16(lanes) * scale


@njit(cache=True, inline="always")
def _plus_key16(span, at, query, lanes):
    """lanes + span[at:at+16] * query (fp16 values: exact products)."""
    return simd.add_exact_product(load16(span, at), query, lanes)


@njit(cache=True, inline="always")
def scores_any(span, n, head_dim, queries, at_q, prompt, scale, scores, at_s, avx512=False):
    """Any head_dim (prompt: a multiple of 8, of 16 with avx512)."""
    for o in range(n):
        if prompt:
            if avx512:
                s = dot_prompt_wide(span, o * head_dim, queries, at_q, head_dim)
            else:
                s = dot_prompt(span, o * head_dim, queries, at_q, head_dim)
        elif avx512:
            s = dot_decode_wide(span, o * head_dim, queries, at_q, head_dim)
        else:
            s = dot_decode(span, o * head_dim, queries, at_q, head_dim)
        scores[at_s + o] = s * scale


@njit(cache=True, inline="always")
def weighted_rows_streamed(span, n, head_dim, weights, at_w, num_lanes, acc, at_acc, first):
    """weighted_rows for the decode orders (32 or 64 lanes: a span's rows reach each lane once or
    twice, so there is nothing to keep in registers), one row after the other through memory.
    first: the item's first span; a lane's first row is added to zero registers and the lanes
    no row reaches are zeroed, so acc needs no clearing before."""
    vector_end = head_dim // 8 * 8
    lane_mask = num_lanes - 1
    zero = simd.zeros_f32x8()
    for o in range(n):
        weight = vec8.broadcast(weights, at_w + o)
        at, row = at_acc + (o & lane_mask) * head_dim, o * head_dim
        if first and o < num_lanes:
            for d in range(0, vector_end, 8):
                simd.store_f32x8(acc, at + d, simd.add_exact_product(weight, simd.load_f32x8(span, row + d), zero))
            for d in range(vector_end, head_dim):
                acc[at + d] = np.float32(0.0) + weights[at_w + o] * span[row + d]
        else:
            for d in range(0, vector_end, 8):
                lane = simd.load_f32x8(acc, at + d)
                simd.store_f32x8(acc, at + d, simd.add_exact_product(weight, simd.load_f32x8(span, row + d), lane))
            for d in range(vector_end, head_dim):
                acc[at + d] += weights[at_w + o] * span[row + d]
    if first:
        unreached, end = at_acc + min(n, num_lanes) * head_dim, at_acc + num_lanes * head_dim
        for i in range(unreached, end - 7, 8):
            simd.store_f32x8(acc, i, zero)
        for i in range(end - (end - unreached) % 8, end):
            acc[i] = 0.0


@njit(cache=True, inline="always")
def weighted_lane(values, n, head_dim, weights, at_w, step, acc, at, first):
    """One lane of a decode-order P . V: acc[at:at+head_dim] += weights[at_w + r * step] * values
    row r for r < n, in row order (first: from zero). 64 output elements at a time stay in
    registers over the rows."""
    wide_end = head_dim // 64 * 64
    vector_end = head_dim // 8 * 8
    zero = simd.zeros_f32x8()
    for d in range(0, wide_end, 64):
        if first:
            a0, a1, a2, a3, a4, a5, a6, a7 = zero, zero, zero, zero, zero, zero, zero, zero
        else:
            a0, a1, a2, a3 = _row(acc, at + d, 8, 0), _row(acc, at + d, 8, 1), _row(acc, at + d, 8, 2), \
                _row(acc, at + d, 8, 3)
            a4, a5, a6, a7 = _row(acc, at + d, 8, 4), _row(acc, at + d, 8, 5), _row(acc, at + d, 8, 6), \
                _row(acc, at + d, 8, 7)
        for r in range(n):
            w, row = at_w + r * step, r * head_dim + d
            a0, a1 = _weighted(weights, w, values, row, a0), _weighted(weights, w, values, row + 8, a1)
            a2, a3 = _weighted(weights, w, values, row + 16, a2), _weighted(weights, w, values, row + 24, a3)
            a4, a5 = _weighted(weights, w, values, row + 32, a4), _weighted(weights, w, values, row + 40, a5)
            a6, a7 = _weighted(weights, w, values, row + 48, a6), _weighted(weights, w, values, row + 56, a7)
        simd.store_f32x8(acc, at + d, a0)
        simd.store_f32x8(acc, at + d + 8, a1)
        simd.store_f32x8(acc, at + d + 16, a2)
        simd.store_f32x8(acc, at + d + 24, a3)
        simd.store_f32x8(acc, at + d + 32, a4)
        simd.store_f32x8(acc, at + d + 40, a5)
        simd.store_f32x8(acc, at + d + 48, a6)
        simd.store_f32x8(acc, at + d + 56, a7)
    for d in range(wide_end, vector_end, 8):
        a = zero if first else simd.load_f32x8(acc, at + d)
        for r in range(n):
            a = _weighted(weights, at_w + r * step, values, r * head_dim + d, a)
        simd.store_f32x8(acc, at + d, a)
    for d in range(vector_end, head_dim):
        total = np.float32(0.0) if first else acc[at + d]
        for r in range(n):
            total += weights[at_w + r * step] * values[r * head_dim + d]
        acc[at + d] = total


@njit(cache=True, inline="always")
def lane_sums_wide(values, n, head_dim, row_stride, weights, at_w, result):
    """A 64-lane decode-order P . V over value rows [0, n) (row r at values[r * row_stride:], in
    lane r % 64, in row order), reduced by reduce_64 -> result[:head_dim]; 16 output elements at a
    time with 8 of the lanes in registers at once (head_dim a multiple of 16; result[head_dim:
    head_dim + LANE_SUMS_SCRATCH] scratch)."""
    full = n // 64 * 64
    for d in range(0, head_dim, 16):
        for j in range(8):             # lanes j, j+8, ..., j+56
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zeros16()
            for r in range(j, full, 64):       # every lane has a row here
                a0, a1 = _plus_row(values, row_stride, d, weights, at_w, r, a0), \
                    _plus_row(values, row_stride, d, weights, at_w, r + 8, a1)
                a2, a3 = _plus_row(values, row_stride, d, weights, at_w, r + 16, a2), \
                    _plus_row(values, row_stride, d, weights, at_w, r + 24, a3)
                a4, a5 = _plus_row(values, row_stride, d, weights, at_w, r + 32, a4), \
                    _plus_row(values, row_stride, d, weights, at_w, r + 40, a5)
                a6, a7 = _plus_row(values, row_stride, d, weights, at_w, r + 48, a6), \
                    _plus_row(values, row_stride, d, weights, at_w, r + 56, a7)
            r = full + j                       # the last rows reach only the first n % 64 lanes
            if r < n:
                a0 = _plus_row(values, row_stride, d, weights, at_w, r, a0)
            if r + 8 < n:
                a1 = _plus_row(values, row_stride, d, weights, at_w, r + 8, a1)
            if r + 16 < n:
                a2 = _plus_row(values, row_stride, d, weights, at_w, r + 16, a2)
            if r + 24 < n:
                a3 = _plus_row(values, row_stride, d, weights, at_w, r + 24, a3)
            if r + 32 < n:
                a4 = _plus_row(values, row_stride, d, weights, at_w, r + 32, a4)
            if r + 40 < n:
                a5 = _plus_row(values, row_stride, d, weights, at_w, r + 40, a5)
            if r + 48 < n:
                a6 = _plus_row(values, row_stride, d, weights, at_w, r + 48, a6)
            if r + 56 < n:
                a7 = _plus_row(values, row_stride, d, weights, at_w, r + 56, a7)
            store16(result, head_dim + 16 * j, _lane_group_sum(a0, a1, a2, a3, a4, a5, a6, a7))
        _reduce_lane_groups(result, head_dim, result, d)


@njit(cache=True, inline="always")
def lane_sums_wide_three(values, n, head_dim, row_stride, weights, at_w, width, result):
    """lane_sums_wide for 3 query heads at once (weights at at_w, +width, +2 * width) -> result[h *
    head_dim:(h + 1) * head_dim] for head h; each value row is loaded once for the three.
    result[3 * head_dim:3 * head_dim + LANE_SUMS_SCRATCH] scratch."""
    full = n // 64 * 64
    scratch = 3 * head_dim
    for d in range(0, head_dim, 16):
        for j in range(8):             # lanes j, j+8, ..., j+56 of each head: a*, b*, c*
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zeros16()
            b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = zeros16()
            c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = zeros16()
            for r in range(j, full, 64):       # every lane has a row here
                a0, b0, c0 = _plus_row_three(values, row_stride, d, weights, at_w, width, r, a0, b0, c0)
                a1, b1, c1 = _plus_row_three(values, row_stride, d, weights, at_w, width, r + 8, a1, b1, c1)
                a2, b2, c2 = _plus_row_three(values, row_stride, d, weights, at_w, width, r + 16, a2, b2, c2)
                a3, b3, c3 = _plus_row_three(values, row_stride, d, weights, at_w, width, r + 24, a3, b3, c3)
                a4, b4, c4 = _plus_row_three(values, row_stride, d, weights, at_w, width, r + 32, a4, b4, c4)
                a5, b5, c5 = _plus_row_three(values, row_stride, d, weights, at_w, width, r + 40, a5, b5, c5)
                a6, b6, c6 = _plus_row_three(values, row_stride, d, weights, at_w, width, r + 48, a6, b6, c6)
                a7, b7, c7 = _plus_row_three(values, row_stride, d, weights, at_w, width, r + 56, a7, b7, c7)
            r = full + j                       # the last rows reach only the first n % 64 lanes
            if r < n:
                a0, b0, c0 = _plus_row_three(values, row_stride, d, weights, at_w, width, r, a0, b0, c0)
            if r + 8 < n:
                a1, b1, c1 = _plus_row_three(values, row_stride, d, weights, at_w, width, r + 8, a1, b1, c1)
            if r + 16 < n:
                a2, b2, c2 = _plus_row_three(values, row_stride, d, weights, at_w, width, r + 16, a2, b2, c2)
            if r + 24 < n:
                a3, b3, c3 = _plus_row_three(values, row_stride, d, weights, at_w, width, r + 24, a3, b3, c3)
            if r + 32 < n:
                a4, b4, c4 = _plus_row_three(values, row_stride, d, weights, at_w, width, r + 32, a4, b4, c4)
            if r + 40 < n:
                a5, b5, c5 = _plus_row_three(values, row_stride, d, weights, at_w, width, r + 40, a5, b5, c5)
            if r + 48 < n:
                a6, b6, c6 = _plus_row_three(values, row_stride, d, weights, at_w, width, r + 48, a6, b6, c6)
            if r + 56 < n:
                a7, b7, c7 = _plus_row_three(values, row_stride, d, weights, at_w, width, r + 56, a7, b7, c7)
            store16(result, scratch + 16 * j, _lane_group_sum(a0, a1, a2, a3, a4, a5, a6, a7))
            store16(result, scratch + 128 + 16 * j, _lane_group_sum(b0, b1, b2, b3, b4, b5, b6, b7))
            store16(result, scratch + 256 + 16 * j, _lane_group_sum(c0, c1, c2, c3, c4, c5, c6, c7))
        for h in range(3):
            _reduce_lane_groups(result, scratch + 128 * h, result, h * head_dim + d)


@njit(cache=True, inline="always")
def _lane_group_sum(a0, a1, a2, a3, a4, a5, a6, a7):
    """reduce_64's lanes j+8 and j of its 16 from lanes j, j+8, ..., j+56: ((j+8) + (j+40)) +
    ((j+24) + (j+56)) plus j's."""
    return simd.add(simd.add(simd.add(a1, a5), simd.add(a3, a7)), simd.add(simd.add(a0, a4), simd.add(a2, a6)))


@njit(cache=True, inline="always")
def _reduce_lane_groups(groups, at, result, at_r):
    """reduce_16's ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)) of the 8 groups' sums at
    groups[at:at+128], element-wise -> result[at_r:at_r+16]."""
    b0, b1, b2, b3 = load16(groups, at), load16(groups, at + 16), load16(groups, at + 32), load16(groups, at + 48)
    b4, b5, b6, b7 = load16(groups, at + 64), load16(groups, at + 80), load16(groups, at + 96), \
        load16(groups, at + 112)
    store16(result, at_r, simd.add(simd.add(simd.add(b4, b0), simd.add(b6, b2)),
                                   simd.add(simd.add(b5, b1), simd.add(b7, b3))))


@njit(cache=True, inline="always")
def _plus_row_three(values, row_stride, d, weights, at_w, width, r, a, b, c):
    """_plus_row for three heads' weights (at at_w, +width, +2 * width) and one load of the row."""
    row = load16(values, r * row_stride + d)
    return (simd.add_exact_product(broadcast16(weights, at_w + r), row, a),
            simd.add_exact_product(broadcast16(weights, at_w + width + r), row, b),
            simd.add_exact_product(broadcast16(weights, at_w + 2 * width + r), row, c))


@njit(cache=True, inline="always")
def _plus_row(values, row_stride, d, weights, at_w, r, lane):
    """lane + weights[at_w + r] * values row r, elements d..d+15 (fp16 values: the product is exact)."""
    return simd.add_exact_product(broadcast16(weights, at_w + r), load16(values, r * row_stride + d), lane)


@njit(cache=True, inline="always")
def _weighted(weights, at_w, span, row, lane):
    """lane + weights[at_w] * span[row:row+8] (fp16 values: the product is exact)."""
    return simd.add_exact_product(vec8.broadcast(weights, at_w), simd.load_f32x8(span, row), lane)


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
                    l0 = _weighted(weights, at_w + o, span, row, l0)
                    l1 = _weighted(weights, at_w + o + 1, span, row + head_dim, l1)
                    l2 = _weighted(weights, at_w + o + 2, span, row + 2 * head_dim, l2)
                    l3 = _weighted(weights, at_w + o + 3, span, row + 3 * head_dim, l3)
                    l4 = _weighted(weights, at_w + o + 4, span, row + 4 * head_dim, l4)
                    l5 = _weighted(weights, at_w + o + 5, span, row + 5 * head_dim, l5)
                    l6 = _weighted(weights, at_w + o + 6, span, row + 6 * head_dim, l6)
                    l7 = _weighted(weights, at_w + o + 7, span, row + 7 * head_dim, l7)
                else:
                    l0 = _weighted(weights, at_w + o, span, row, l0)
                    if o + 1 < n:
                        l1 = _weighted(weights, at_w + o + 1, span, row + head_dim, l1)
                    if o + 2 < n:
                        l2 = _weighted(weights, at_w + o + 2, span, row + 2 * head_dim, l2)
                    if o + 3 < n:
                        l3 = _weighted(weights, at_w + o + 3, span, row + 3 * head_dim, l3)
                    if o + 4 < n:
                        l4 = _weighted(weights, at_w + o + 4, span, row + 4 * head_dim, l4)
                    if o + 5 < n:
                        l5 = _weighted(weights, at_w + o + 5, span, row + 5 * head_dim, l5)
                    if o + 6 < n:
                        l6 = _weighted(weights, at_w + o + 6, span, row + 6 * head_dim, l6)
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
