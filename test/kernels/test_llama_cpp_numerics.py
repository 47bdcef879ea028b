"""Bit-exact agreement with llama.cpp's CPU numerics (x86 AVX2 + FMA build).

ggml_vec_fixture.json holds outputs of llama.cpp's own exported vector kernels (see
test/fixtures/make_ggml_vec_fixture.py). Where llama.cpp's kernel is not exported (tinyBLAS,
softmax inside attention, rope, rms_norm) the summation order is restated here in plain NumPy
float32 element-wise operations, which round exactly like the C code.
"""
import json
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from edge_slm_node.kernels import ops, simd, vec8
from edge_slm_node.kernels.attention import paged_attention
from edge_slm_node.kernels.attention_math import dot_f16 as _dot_f16

FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "ggml_vec_fixture.json").read_text())
f32 = np.float32


def floats(bits):
    return np.array(bits, np.uint32).view(np.float32)


@njit
def _exp_all(x, out):
    for i in range(x.shape[0]):
        out[i] = ops.exp_f32(x[i])


def exp_f32(x):
    out = np.empty_like(x)
    _exp_all(x, out)
    return out


def test_exp_is_ggml_vector_exp():
    x, expected = floats(FIXTURE["exp"]["x"]), floats(FIXTURE["exp"]["y"])
    np.testing.assert_array_equal(exp_f32(x).view(np.uint32), expected.view(np.uint32))


@njit
def _vector_exp(x, out):
    for i in range(0, x.shape[0], 8):
        simd.store_f32x8(out, i, vec8.exp(simd.load_f32x8(x, i)))


def test_vector_exp_is_ggml_vector_exp_lane_by_lane():
    """vec8.exp takes its special path (|n| > 126: x beyond ~+-87.3, or -inf) only for vectors with
    such a lane: on the fixture's inputs, and with one special lane put among 7 ordinary ones at
    every lane position, it equals ggml's outputs and the scalar statement in every lane."""
    x, expected = floats(FIXTURE["exp"]["x"]), floats(FIXTURE["exp"]["y"])
    out = np.full_like(x, np.nan)
    _vector_exp(x, out)
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))
    rng = np.random.default_rng(7)
    special = np.array([-np.inf, -150.0, -100.0, -88.0, 88.5, 95.0, 140.0, 200.0], np.float32)
    mixed = rng.uniform(-80.0, 80.0, 8 * 8 * len(special)).astype(np.float32)
    for s, value in enumerate(special):
        for lane in range(8):
            mixed[8 * (8 * s + lane) + lane] = value
    out = np.full_like(mixed, np.nan)
    _vector_exp(mixed, out)
    np.testing.assert_array_equal(out.view(np.uint32), exp_f32(mixed).view(np.uint32))
    assert np.count_nonzero(np.abs(mixed) > 87.5) == 8 * len(special)


def test_silu_mul_is_ggml_swiglu_including_the_scalar_tail():
    gate, up = floats(FIXTURE["swiglu"]["gate"])[None, :], floats(FIXTURE["swiglu"]["up"])[None, :]
    out = np.zeros_like(gate)
    ops.silu_mul(gate, up, out)
    np.testing.assert_array_equal(out[0].view(np.uint32), FIXTURE["swiglu"]["y"])
    ops.silu_mul(gate, np.ones_like(gate), out)                # times 1 is exact: plain silu
    np.testing.assert_array_equal(out[0].view(np.uint32), FIXTURE["silu"]["y"])


@pytest.mark.parametrize("case", FIXTURE["dot_f16"], ids=lambda c: f"n{len(c['a'])}")
def test_decode_order_dot_is_ggml_vec_dot_f16(case):
    a = np.array(case["a"], np.uint16).view(np.float16).astype(np.float32)
    b = np.array(case["b"], np.uint16).view(np.float16).astype(np.float32)
    got = _dot_f16(a, b, False, np.zeros(32, np.float32))
    assert np.float32(got).view(np.uint32) == case["dot"]


# ------------------------------------------------------------ NumPy restatements of the orders

def hsum8(v):
    """hsum_float_8 over the last axis (8 lanes)."""
    a = v[..., 4:8] + v[..., 0:4]
    return (a[..., 0] + a[..., 2]) + (a[..., 1] + a[..., 3])


def reduce_32(v):
    """ggml_vec_dot_f16's reduction of 4 vectors x 8 lanes (last axis, lane 8*j + i)."""
    j = v.reshape(v.shape[:-1] + (4, 8))
    s = (j[..., 1, :] + j[..., 3, :]) + (j[..., 0, :] + j[..., 2, :])
    t = s[..., 4:8] + s[..., 0:4]
    return (t[..., 0] + t[..., 1]) + (t[..., 2] + t[..., 3])


def lane_sums(a, b, lanes):
    """Per-lane float32 sums of a*b (a, b (..., n)), lane = index % lanes, in index order."""
    acc = np.zeros(a.shape[:-1] + (lanes,), np.float32)
    for s in range(0, a.shape[-1] // lanes * lanes, lanes):
        acc = acc + a[..., s:s + lanes] * b[..., s:s + lanes]
    return acc


def dot_decode(a, b):
    n32 = a.shape[-1] // 32 * 32
    total = reduce_32(lane_sums(a, b, 32)).astype(np.float64)
    for i in range(n32, a.shape[-1]):
        total = total + (a[..., i] * b[..., i]).astype(np.float64)
    return total.astype(np.float32)


def llama_attention(q, keys, values, scale, prompt_order):
    """q (heads, d) f32; keys/values (n, kv_heads, d) fp16 -> (heads, d) in llama.cpp's order."""
    heads, (n, kv_heads, d) = q.shape[0], keys.shape
    group = heads // kv_heads
    q16 = q.astype(np.float16).astype(np.float32)
    out = np.zeros_like(q)
    padded = -(-n // 32) * 32                                   # llama's KV length is a multiple of 256
    for h in range(heads):
        k = keys[:, h // group].astype(np.float32)
        v = np.zeros((padded, d), np.float32)
        v[:n] = values[:, h // group]
        if prompt_order and d % 8 == 0:
            s = hsum8(lane_sums(k, np.broadcast_to(q16[h], k.shape), 8))
        else:
            s = dot_decode(k, np.broadcast_to(q16[h], k.shape))
        s = s * np.float32(scale)
        e = np.zeros(padded, np.float32)
        e[:n] = exp_f32((s - s.max()).astype(np.float32))
        total = np.cumsum(hsum8(e.reshape(-1, 8)).astype(np.float64))[-1]
        p = (e * np.float32(1.0 / total)).astype(np.float16).astype(np.float32)
        lanes = 8 if prompt_order and d % 4 == 0 else 32
        acc = np.zeros((lanes, d), np.float32)
        for pos in range(padded):
            acc[pos % lanes] = acc[pos % lanes] + p[pos] * v[pos]
        out[h] = hsum8(acc.T) if lanes == 8 else reduce_32(acc.T)
    return out


@pytest.mark.parametrize("prompt_order", [False, True])
@pytest.mark.parametrize("head_dim,context", [(64, 1), (64, 45), (64, 300), (16, 37), (8, 9), (48, 70)])
def test_attention_is_bit_exact_in_both_orders(prompt_order, head_dim, context):
    rng = np.random.default_rng(head_dim * 1000 + context)
    heads, kv_heads, block_size, num_blocks = 6, 2, 16, 32
    table = rng.permutation(num_blocks)[:-(-context // block_size)].astype(np.int32)
    keys = (rng.standard_normal((context, kv_heads, head_dim)) * 2).astype(np.float16)
    values = rng.standard_normal((context, kv_heads, head_dim)).astype(np.float16)
    k_cache = np.zeros((num_blocks, block_size, kv_heads, head_dim), np.uint16)
    v_cache = np.zeros_like(k_cache)
    for p in range(context):
        k_cache[table[p // block_size], p % block_size] = keys[p].view(np.uint16)
        v_cache[table[p // block_size], p % block_size] = values[p].view(np.uint16)
    q = (rng.standard_normal((1, heads, head_dim)) * 3).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(np.float32(head_dim))
    out = np.zeros_like(q)
    paged_attention(q.copy(), k_cache, v_cache, table[None, :], np.zeros(1, np.int32), np.array([context], np.int32),
                    np.array([prompt_order], np.uint8), scale, out)
    expected = llama_attention(q[0], keys, values, scale, prompt_order)
    np.testing.assert_array_equal(out[0].view(np.uint32), expected.view(np.uint32))


def test_rms_norm_rounds_each_square_to_float32():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((7, 576)) * 5).astype(np.float32)      # four rows together, three alone
    w = rng.standard_normal(576).astype(np.float32)
    out = np.zeros_like(x)
    eps = np.float32(1e-5)
    ops.rms_norm(x, w, eps, out)
    sums = np.cumsum((x * x).astype(np.float64), axis=1)[:, -1]        # sequential float64 sum
    scale = np.float32(1.0) / np.sqrt((sums / x.shape[1]).astype(np.float32) + eps)
    np.testing.assert_array_equal(out, (x * scale[:, None]) * w)


@pytest.mark.parametrize("neox", [False, True])
def test_rope_uses_fused_multiply_add_like_ggml(neox):
    rng = np.random.default_rng(4)
    head_dim, positions = 64, np.array([0, 1, 17, 300], np.int32)
    x = rng.standard_normal((4, 3, head_dim)).astype(np.float32)
    cos, sin = ops.rope_tables(512, head_dim, 100000.0)
    rotated = x.copy()
    ops.apply_rope(rotated, positions, cos, sin, neox)
    half = head_dim // 2
    a, b = (np.arange(half), np.arange(half) + half) if neox else (np.arange(0, head_dim, 2), np.arange(1, head_dim, 2))
    c, s = cos[positions][:, None, :].astype(np.float64), sin[positions][:, None, :].astype(np.float64)
    x0, x1 = x[..., a].astype(np.float64), x[..., b].astype(np.float64)
    # fma(x0, c, -(x1*s)) and fma(x0, s, x1*c); x0*c is exact in float64, one rounding to float32
    first = (x0 * c - (x1 * s).astype(np.float32)).astype(np.float32)
    second = (x0 * s + (x1 * c).astype(np.float32)).astype(np.float32)
    np.testing.assert_array_equal(rotated[..., a], first)
    np.testing.assert_array_equal(rotated[..., b], second)


def test_by_default_each_sequences_tokens_in_a_batch_are_one_call():
    from edge_slm_node.model.transformer import default_calls
    # sequence 0 decodes one token, sequence 1 prefills three, sequence 2 decodes one
    index, length = default_calls(np.array([0, 1, 1, 1, 2], np.int32), 3)
    np.testing.assert_array_equal(index, [0, 0, 1, 2, 0])
    np.testing.assert_array_equal(length, [1, 3, 3, 3, 1])
    index, length = default_calls(np.array([1, 0, 1], np.int32), 2)
    np.testing.assert_array_equal(index, [0, 0, 1])
    np.testing.assert_array_equal(length, [2, 1, 2])
