"""The avx512 numerics (Transformer(avx512=True)): attention, softmax and SwiGLU as llama.cpp's
native AVX-512 build rounds them. ggml_vec_fixture_avx512.json holds that build's own outputs
(test/fixtures/make_ggml_vec_fixture.py); paged attention is checked against a scalar statement
of its orders: ggml_vec_dot_f16 with 4 vectors x 16 lanes, (v0 + v2) + (v1 + v3) and
_mm512_reduce_add_ps for one-token calls, tinyBLAS with 16 lanes for prompts, softmax sums of 16."""
import json
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from edge_slm_node.kernels import ops, vec8, simd
from edge_slm_node.kernels.attention import paged_attention
from edge_slm_node.kernels.attention_math import dot_decode_wide, dot_f16, dot_prompt_wide
from edge_slm_node.kernels.half import half_bits_to_float, round_to_half

FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "ggml_vec_fixture_avx512.json").read_text())
bits = lambda values: np.array(values, np.uint32).view(np.float32)


def test_fixture_comes_from_an_avx512_build():
    assert "AVX512 = 1" in FIXTURE["provenance"]["system_info"]


@njit
def _exp_scalar(x, out):
    for i in range(x.shape[0]):
        out[i] = ops.exp_wide_f32(x[i])


@njit
def _exp_vector(x, out):
    for i in range(0, x.shape[0], 8):
        simd.store_f32x8(out, i, vec8.exp_wide(simd.load_f32x8(x, i)))


def test_exp_equals_the_avx512_vector_exp():
    """ggml_vec_soft_max_f32 with max 0 (its 16-wide loop covers all 512 inputs: edges, -inf)."""
    x, want = bits(FIXTURE["exp"]["x"]), bits(FIXTURE["exp"]["y"])
    assert len(x) % 16 == 0
    for kernel in (_exp_scalar, _exp_vector):
        out = np.full_like(x, np.nan)
        kernel(x, out)
        np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


def test_swiglu_and_silu_equal_the_avx512_build():
    """16-wide vector loop, the last n % 16 (here 15) values with libm's expf."""
    gate, up, want = bits(FIXTURE["swiglu"]["gate"]), bits(FIXTURE["swiglu"]["up"]), bits(FIXTURE["swiglu"]["y"])
    out = np.full((1, len(gate)), np.nan, np.float32)
    ops.silu_mul(gate[None].copy(), up[None].copy(), out, True)
    np.testing.assert_array_equal(out[0].view(np.uint32), want.view(np.uint32))
    x, silu = bits(FIXTURE["silu"]["x"]), bits(FIXTURE["silu"]["y"])
    ops.silu_mul(x[None].copy(), np.ones((1, len(x)), np.float32), out, True)
    np.testing.assert_array_equal(out[0].view(np.uint32), silu.view(np.uint32))
    ops.silu_mul(gate[None].copy(), up[None].copy(), out, False)            # the AVX2 build's differ here
    assert not np.array_equal(out[0], want)


@njit
def _dots(a, b, lanes):
    return dot_f16(a, b, False, lanes, True), dot_decode_wide(a, 0, b, 0, a.shape[0])


@pytest.mark.parametrize("case", FIXTURE["dot_f16"], ids=lambda c: f"n{len(c['a'])}")
def test_dot_f16_equals_ggml_vec_dot_f16(case):
    a = np.array(case["a"], np.uint16).view(np.float16).astype(np.float32)
    b = np.array(case["b"], np.uint16).view(np.float16).astype(np.float32)
    scalar, vector = _dots(a, b, np.zeros(64, np.float32))
    want = np.array([case["dot"]], np.uint32).view(np.float32)[0]
    assert scalar == want and vector == want


@njit
def _prompt_dots(a, b, lanes):
    return dot_f16(a, b, True, lanes, True), dot_prompt_wide(a, 0, b, 0, a.shape[0])


@pytest.mark.parametrize("n", [16, 64, 80, 256])
def test_prompt_dot_vector_form_equals_its_scalar_statement(n):
    rng = np.random.default_rng(n)
    a = (rng.standard_normal(n) * 9).astype(np.float16).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float16).astype(np.float32)
    scalar, vector = _prompt_dots(a, b, np.zeros(64, np.float32))
    assert scalar == vector


# ----------------------------------------------------------- paged attention, scalar reference

@njit
def _reduce16(v):
    a = np.empty(8, np.float32)
    for i in range(8):
        a[i] = v[8 + i] + v[i]
    return ((a[4] + a[0]) + (a[6] + a[2])) + ((a[5] + a[1]) + (a[7] + a[3]))


@njit
def _reduce64(v):
    w = np.empty(16, np.float32)
    for i in range(16):
        w[i] = (v[i] + v[32 + i]) + (v[16 + i] + v[48 + i])
    return _reduce16(w)


@njit
def _dot(a, b, prompt):
    n = a.shape[0]
    if prompt and n % 16 == 0:
        lanes = np.zeros(16, np.float32)
        for i in range(n):
            lanes[i % 16] += a[i] * b[i]
        return _reduce16(lanes)
    end = n // 64 * 64
    total = 0.0
    if end:
        lanes = np.zeros(64, np.float32)
        for i in range(end):
            lanes[i % 64] += a[i] * b[i]
        total = np.float64(_reduce64(lanes))
    for i in range(end, n):
        total += np.float64(a[i] * b[i])
    return np.float32(total)


@njit
def reference_attention_avx512(q, k_cache, v_cache, tables, seq, context, prompt_order, scale, out):
    num_tokens, heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    scratch, row = np.zeros(head_dim, np.uint32), np.zeros(head_dim, np.float32)
    for t in range(num_tokens):
        n, prompt = context[t], prompt_order[t] != 0
        table = tables[seq[t]]
        num_lanes = 16 if prompt and head_dim % 4 == 0 else 64
        for h in range(heads):
            kv = h // group
            query = np.empty(head_dim, np.float32)
            for d in range(head_dim):
                query[d] = round_to_half(q[t, h, d])
            scores = np.zeros((n + 15) // 16 * 16, np.float32)
            for p in range(n):
                half_bits_to_float(k_cache[table[p // block_size], p % block_size, kv], scratch, row)
                scores[p] = _dot(row, query, prompt) * scale
            peak = scores[:n].max()
            total = 0.0
            for s in range(0, n, 16):
                for i in range(16):
                    scores[s + i] = ops.exp_wide_f32(scores[s + i] - peak) if s + i < n else np.float32(0.0)
                total += np.float64(_reduce16(scores[s:s + 16]))
            inverse = np.float32(1.0 / total)
            acc = np.zeros((num_lanes, head_dim), np.float32)
            for p in range(n):
                half_bits_to_float(v_cache[table[p // block_size], p % block_size, kv], scratch, row)
                weight = round_to_half(scores[p] * inverse)
                for d in range(head_dim):
                    acc[p % num_lanes, d] += weight * row[d]
            for d in range(head_dim):
                out[t, h, d] = _reduce16(acc[:, d].copy()) if num_lanes == 16 else _reduce64(acc[:, d].copy())


def _batch(rng, heads, kv_heads, head_dim, block_size, runs, prompt):
    """(context, new tokens) per sequence; the new tokens are each sequence's last positions."""
    needed = [-(-context // block_size) for context, _ in runs]
    num_blocks = sum(needed) + 3
    k_cache, v_cache = [(rng.standard_normal((num_blocks, block_size, kv_heads, head_dim)) * s).astype(np.float16)
                        .view(np.uint16) for s in (2.0, 1.0)]
    tables = np.zeros((len(runs), max(needed)), np.int32)
    order = rng.permutation(num_blocks)
    seq, context, prompt_order, used = [], [], [], 0
    for s, ((last, new), n) in enumerate(zip(runs, needed)):
        tables[s, :n] = order[used:used + n]
        used += n
        seq += [s] * new
        context += list(range(last - new + 1, last + 1))
        prompt_order += [prompt if new > 1 else 0] * new
    q = (rng.standard_normal((len(seq), heads, head_dim)) * 3).astype(np.float32)
    return q, k_cache, v_cache, tables, np.array(seq, np.int32), np.array(context, np.int32), np.array(prompt_order, np.uint8)


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
@pytest.mark.parametrize("head_dim", [64, 48, 20, 80, 128])
@pytest.mark.parametrize("runs", [[(1, 1)], [(17, 1), (130, 1)], [(33, 1), (80, 11)], [(15, 15), (130, 9), (64, 2)],
                                  [(1100, 1), (1030, 2)], [(256, 1), (257, 1), (240, 1)]],
                         ids=["one", "decode", "mixed", "prompts", "long", "value-rows"])
@pytest.mark.parametrize("heads,kv_heads", [(14, 2), (9, 3)], ids=["group7", "group3"])
def test_paged_attention_avx512_is_bit_equal_to_its_scalar_statement(runs, head_dim, parallel, heads, kv_heads):
    """Groups of 7 (two trios of query heads and one alone) and of 3 query heads per KV head."""
    rng = np.random.default_rng(head_dim + len(runs))
    scale = np.float32(1.0) / np.sqrt(np.float32(head_dim))
    q, k_cache, v_cache, tables, seq, context, prompt_order = _batch(rng, heads, kv_heads, head_dim, 16, runs, 1)
    want = np.zeros_like(q)
    reference_attention_avx512(q, k_cache, v_cache, tables, seq, context, prompt_order, scale, want)
    got = np.full_like(q, np.nan)
    paged_attention(q.copy(), k_cache, v_cache, tables, seq, context, prompt_order, scale, got, parallel=parallel,
                    avx512=True)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
