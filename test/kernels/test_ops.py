"""Element-wise kernels and activation quantization against NumPy references."""
import numpy as np
import pytest
from numba import njit

from edge_slm_node.kernels import ops
from edge_slm_node.kernels.half import float_to_half_bits, half_bits_to_float, round_to_half
from edge_slm_node.kernels.quantize import quantize_rows_q8, quantize_rows_q8_k


@njit
def _round_all(x, out):
    for i in range(x.shape[0]):
        out[i] = round_to_half(x[i])


@njit
def _to_bits_and_back(x, bits, scratch, back):
    float_to_half_bits(x, bits)
    half_bits_to_float(bits, scratch, back)


def test_half_conversions_match_numpy():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(20000).astype(np.float32) * s for s in (1e-7, 1e-4, 1, 300, 2e4)])
    x = np.concatenate([x, np.array([0.0, -0.0, 65504.0, 6.1035e-05, 5.96e-08, 2.9e-08], np.float32)])
    expected = x.astype(np.float16)
    bits, scratch, back = np.zeros(len(x), np.uint16), np.zeros(len(x), np.uint32), np.zeros(len(x), np.float32)
    _to_bits_and_back(x, bits, scratch, back)
    np.testing.assert_array_equal(bits, expected.view(np.uint16))
    finite = np.isfinite(expected)                    # the decoder is documented for finite halves only
    np.testing.assert_array_equal(back[finite], expected[finite].astype(np.float32))
    rounded = np.zeros_like(x)
    _round_all(x, rounded)
    np.testing.assert_array_equal(rounded, expected.astype(np.float32))


@pytest.mark.parametrize("tokens,length", [(1, 32), (3, 576), (5, 1536)])
def test_quantize_rows_q8_matches_reference(tokens, length):
    rng = np.random.default_rng(length)
    x = rng.standard_normal((tokens, length)).astype(np.float32) * 3
    x[-1, :8] = [127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5]     # scale 1: halves round to even
    x[-1, 8:32] = 0.0
    x[0, :32] = 0.0                                   # an all-zero block has scale 0
    xq = np.zeros((tokens, length), np.int8)
    xd = np.zeros((tokens, length // 32), np.float32)
    xs = np.zeros_like(xd)
    quantize_rows_q8(x, xq, xd, xs)
    blocks = x.reshape(tokens, -1, 32)
    amax = np.abs(blocks).max(axis=2)
    inverse = np.divide(np.float32(127.0), amax, out=np.zeros_like(amax), where=amax > 0)
    q = np.rint(blocks * inverse[..., None]).astype(np.int32)
    np.testing.assert_array_equal(xq.reshape(tokens, -1, 32), q)
    d = (amax / np.float32(127.0)).astype(np.float32)
    np.testing.assert_array_equal(xd, d.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(xs, (d * q.sum(axis=2).astype(np.float32)).astype(np.float16).astype(np.float32))
    np.testing.assert_allclose(xq.reshape(tokens, -1, 32) * xd[..., None], blocks, atol=amax.max() / 127)


def _q8_k_reference(block):
    """ggml's quantize_row_q8_K_ref for one block of 256: (q, d, bsums)."""
    amax = largest = np.float32(0.0)
    for value in block:
        if abs(value) > amax:
            amax, largest = abs(value), value
    if amax == 0:
        return np.zeros(256, np.int32), np.float32(0.0), np.zeros(16, np.int32)
    iscale = np.float32(-127.0) / largest
    q = np.minimum(127, np.rint(iscale * block).astype(np.int32))
    return q, np.float32(1.0) / iscale, q.reshape(16, 16).sum(axis=1)


def test_quantize_rows_q8_k_matches_ggml_reference():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 1024)) * 4).astype(np.float32)
    x[0, 10], x[0, 200] = -30.0, 30.0          # a tie of magnitudes: the first one sets the sign of the scale
    x[1, 256:512] = 0.0
    x[1, 512:768] = -0.0
    x[2, 300] = np.nan                        # ignored by the maximum, as ggml's `ax > amax` ignores it
    x[2, 301] = 50.0
    xq = np.zeros((3, 1024), np.int8)
    xd = np.zeros((3, 4), np.float32)
    sums = np.zeros((3, 64), np.int32)
    quantize_rows_q8_k(x, xq, xd, sums)
    for t in range(3):
        for b in range(4):
            q, d, bsums = _q8_k_reference(x[t, 256 * b:256 * (b + 1)])
            assert xd[t, b] == d, (t, b)
            if np.isnan(x[t, 256 * b:256 * (b + 1)]).any():
                continue                          # q of a NaN is undefined in both
            np.testing.assert_array_equal(xq[t, 256 * b:256 * (b + 1)], q)
            np.testing.assert_array_equal(sums[t, 16 * b:16 * (b + 1)], bsums)
    assert xd[0, 0] > 0 and xd[2, 1] == np.float32(1.0) / (np.float32(-127.0) / np.float32(50.0))


def test_rms_norm_silu_and_add():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 96)).astype(np.float32)
    w = rng.standard_normal(96).astype(np.float32)
    out = np.zeros_like(x)
    ops.rms_norm(x, w, 1e-5, out)
    expected = x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(out, expected, rtol=1e-5)
    gate, up = x.copy(), rng.standard_normal((4, 96)).astype(np.float32)
    ops.silu_mul(gate, up, out)
    np.testing.assert_allclose(out, x / (1 + np.exp(-x)) * up, rtol=1e-5)
    y = x.copy()
    ops.add_in_place(y, up)
    np.testing.assert_allclose(y, x + up)


@pytest.mark.parametrize("avx512", [False, True])
def test_silu_mul_by_column_shares_is_the_whole(avx512):
    """What a team's members compute (kernels/layers.py: columns cut at multiples of 16, the last
    share with the scalar tail) adds up to the one-call result, bit for bit."""
    rng = np.random.default_rng(4)
    gate, up = (rng.standard_normal((3, 8 * 16 + 13)).astype(np.float32) * 4 for _ in range(2))
    whole = np.zeros_like(gate)
    ops.silu_mul(gate, up, whole, avx512)
    shares = np.full_like(gate, np.nan)
    for first, last in ((0, 48), (48, 96), (96, gate.shape[1])):
        ops.silu_mul(gate, up, shares, avx512, first, last)
        assert np.isnan(shares[:, last:]).all()                # nothing past its share written
    np.testing.assert_array_equal(shares, whole)


@pytest.mark.parametrize("neox", [False, True])
def test_rope_rotates_pairs_by_position(neox):
    rng = np.random.default_rng(2)
    head_dim, positions = 8, np.array([0, 1, 7, 100], np.int32)
    x = rng.standard_normal((4, 3, head_dim)).astype(np.float32)
    cos, sin = ops.rope_tables(128, head_dim, 10000.0)
    rotated = x.copy()
    ops.apply_rope(rotated, positions, cos, sin, neox)
    half = head_dim // 2
    for t, p in enumerate(positions):
        theta = p * 10000.0 ** (-2.0 * np.arange(half) / head_dim)
        a, b = (np.arange(half), np.arange(half) + half) if neox else (np.arange(0, head_dim, 2), np.arange(1, head_dim, 2))
        x0, x1 = x[t][:, a], x[t][:, b]
        np.testing.assert_allclose(rotated[t][:, a], x0 * np.cos(theta) - x1 * np.sin(theta), rtol=2e-4, atol=2e-4)
        np.testing.assert_allclose(rotated[t][:, b], x0 * np.sin(theta) + x1 * np.cos(theta), rtol=2e-4, atol=2e-4)
    np.testing.assert_array_equal(rotated[0], x[0])   # position 0 is the identity
