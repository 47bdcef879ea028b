"""Quantized matmuls: packed and GGUF-layout kernels bit-equal to scalar references (Q4_1, Q8_0 in
llama.cpp's summation order), close to NumPy."""
import base64
import json
import mmap
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from edge_slm_node.kernels import matmul, matmul_rows
from edge_slm_node.model import linear as linear_module
from edge_slm_node.kernels.half import HALF_TO_FLOAT
from edge_slm_node.kernels.ops import fma_f32
from edge_slm_node.kernels.quantize import quantize_rows_q8
from edge_slm_node.kernels.repack import gather_rows_q8_0, repack, unpack
from edge_slm_node.model.linear import FusedLinear, PreparedInput, QuantizedLinear, release_file_pages
from edge_slm_node.model.quant import F16, F32, Q4_0, Q4_1, Q8_0, dequantize, quantize

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# Scalar references, one output value at a time, straight from the GGUF bytes. Q4_1 and Q8_0:
# llama.cpp's x86 AVX2+FMA order (ggml_vec_dot_q4_1_q8_1 / ggml_vec_dot_q8_0_q8_0): 8 float
# lanes, lane l = the 4-weight group l of each block (Q4_1: lanes 0-3 the low nibbles of bytes
# 4l..4l+3, lanes 4-7 their high nibbles), lane = fma(d_w*d_x, isum, lane) block by block,
# summs = fma(m, s, summs), result ((a4+a0)+(a6+a2)) + ((a5+a1)+(a7+a3)) + summs.
# Q4_0: the kernels' simple order (acc += d_w*d_x*isum per block), not llama.cpp's.
@njit
def _half(row, at, half_to_float):
    return half_to_float[np.int64(row[at]) | (np.int64(row[at + 1]) << 8)]


@njit
def _llama_hsum(lanes):
    return ((lanes[4] + lanes[0]) + (lanes[6] + lanes[2])) + ((lanes[5] + lanes[1]) + (lanes[7] + lanes[3]))


@njit
def _llama_q4_1(weights, xq, xd, xs, half_to_float, out):
    lanes = np.zeros(8, np.float32)
    for r in range(weights.shape[0]):
        row = weights[r]
        for t in range(xd.shape[0]):
            lanes[:] = 0
            summs = np.float32(0.0)
            for b in range(xd.shape[1]):
                base = b * 20
                dd = _half(row, base, half_to_float) * xd[t, b]
                summs = fma_f32(_half(row, base + 2, half_to_float), xs[t, b], summs)
                for lane in range(8):
                    isum = 0
                    for e in range(4):
                        byte = np.int32(row[base + 4 + 4 * (lane % 4) + e])
                        nibble = byte & 15 if lane < 4 else byte >> 4
                        isum += nibble * np.int32(xq[t, b * 32 + 4 * lane + e])
                    lanes[lane] = fma_f32(dd, np.float32(isum), lanes[lane])
            out[t, r] = _llama_hsum(lanes) + summs


@njit
def _simple_q4_0(weights, xq, xd, half_to_float, out):
    for r in range(weights.shape[0]):
        row = weights[r]
        for t in range(xd.shape[0]):
            acc = np.float32(0.0)
            for b in range(xd.shape[1]):
                base = b * 18
                d = half_to_float[np.int64(row[base]) | (np.int64(row[base + 1]) << 8)]
                isum = np.int32(0)
                for j in range(16):
                    byte = np.int32(row[base + 2 + j])
                    isum += ((byte & 15) - 8) * np.int32(xq[t, b * 32 + j]) + ((byte >> 4) - 8) * np.int32(xq[t, b * 32 + 16 + j])
                acc += d * xd[t, b] * np.float32(isum)
            out[t, r] = acc


@njit
def _llama_q8_0(weights, xq, xd, half_to_float, out):
    signed = weights.view(np.int8)
    lanes = np.zeros(8, np.float32)
    for r in range(weights.shape[0]):
        for t in range(xd.shape[0]):
            lanes[:] = 0
            for b in range(xd.shape[1]):
                base = b * 34
                dd = _half(weights[r], base, half_to_float) * xd[t, b]
                for lane in range(8):
                    isum = 0
                    for e in range(4):
                        isum += np.int32(signed[r, base + 2 + 4 * lane + e]) * np.int32(xq[t, b * 32 + 4 * lane + e])
                    lanes[lane] = fma_f32(dd, np.float32(isum), lanes[lane])
            out[t, r] = _llama_hsum(lanes)


def _scalar_reference(raw, quant, prepared):
    out = np.zeros((prepared.num_tokens, raw.shape[0]), np.float32)
    if quant is Q4_1:
        _llama_q4_1(raw, prepared.xq, prepared.xd, prepared.xs, HALF_TO_FLOAT, out)
    elif quant is Q4_0:
        _simple_q4_0(raw, prepared.xq, prepared.xd, HALF_TO_FLOAT, out)
    else:
        _llama_q8_0(raw, prepared.xq, prepared.xd, HALF_TO_FLOAT, out)
    return out


def _gguf_reference_kernel(raw, quant, prepared):
    out = np.zeros((prepared.num_tokens, raw.shape[0]), np.float32)
    if quant is Q4_1:
        matmul_rows.matmul_q4_1(raw, prepared.xq, prepared.xd, prepared.xs, HALF_TO_FLOAT, out)
    elif quant is Q4_0:
        matmul_rows.matmul_q4_0(raw, prepared.xq, prepared.xd, HALF_TO_FLOAT, out)
    else:
        matmul_rows.matmul_q8_0(raw, prepared.xq, prepared.xd, HALF_TO_FLOAT, out)
    return out


def _numpy_reference(raw, quant, prepared):
    """float64 dequantize(W) @ dequantized activations (+ Q4_1's m*xs term as the kernels use it);
    also returns |W| @ |x|, the scale of the rounding error a float32 accumulation may make."""
    weights = dequantize(raw, quant).astype(np.float64)
    blocks = prepared.xd.shape[1]
    xq = prepared.xq.astype(np.float64).reshape(prepared.num_tokens, blocks, 32)
    x = (xq * prepared.xd[:, :, None]).reshape(prepared.num_tokens, -1)
    ref = x @ weights.T
    if quant is Q4_1:   # dequantize's m*sum(x) -> m*xs (xs = fp16(d*sum(q)), as the kernels use)
        m = raw.reshape(-1, 20)[:, 2:4].copy().view(np.float16).astype(np.float64).reshape(raw.shape[0], blocks)
        correction = prepared.xs - prepared.xd * xq.sum(axis=2)
        ref += correction @ m.T
    return ref, np.abs(x) @ np.abs(weights).T


@pytest.fixture(params=["serial", "parallel"])
def threading(request, monkeypatch):
    """Run the packed kernels on the calling thread, or always on numba's thread pool."""
    limit = 0 if request.param == "parallel" else 1 << 62
    monkeypatch.setattr(linear_module, "PARALLEL_MIN_BYTES", limit)
    monkeypatch.setattr(linear_module, "PARALLEL_MIN_MACS", limit)
    return request.param


def _prepared(tokens, length, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((tokens, length)) * rng.uniform(0.1, 3.0, (tokens, 1))).astype(np.float32)
    return PreparedInput(tokens, length, True, False).prepare(x)


def _raw(quant, rows, length, seed):
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((rows, length)).astype(np.float32) * rng.uniform(0.01, 1.0, (rows, 1))
    return quantize(weights.astype(np.float32), quant)


@pytest.mark.parametrize("quant", [Q4_0, Q4_1, Q8_0], ids=lambda q: q.name)
@pytest.mark.parametrize("rows", [1, 7, 8, 13, 37])
@pytest.mark.parametrize("length", [32, 64, 576, 1536])
@pytest.mark.parametrize("tokens", [1, 3, 17])
def test_kernels_bit_equal_to_scalar_reference(quant, rows, length, tokens, threading):
    raw = _raw(quant, rows, length, seed=rows * 1000 + length)
    prepared = _prepared(tokens, length, seed=tokens)
    linear = QuantizedLinear("w", raw, quant, length)
    out = np.full((tokens, rows), np.nan, np.float32)
    linear.apply(prepared, out)
    expected = _scalar_reference(raw, quant, prepared)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(_gguf_reference_kernel(raw, quant, prepared), expected)
    ref, scale = _numpy_reference(raw, quant, prepared)
    assert np.all(np.abs(out - ref) <= 1e-3 * np.abs(ref) + 1e-5 * scale)


GGML_FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "ggml_matmul_fixture.json").read_text())


def _ggml_case_inputs(case):
    """The fixture's GGUF weight bytes and ggml Q8_1 / Q8_0 activation blocks as a PreparedInput."""
    rows, length, tokens = case["rows"], case["length"], case["tokens"]
    raw = np.frombuffer(base64.b64decode(case["weights"]), np.uint8).reshape(rows, -1).copy()
    size = 36 if case["quant"] == "Q4_1" else 34          # block_q8_1: d, s, qs[32]; block_q8_0: d, qs[32]
    blocks = np.frombuffer(base64.b64decode(case["activations"]), np.uint8).reshape(tokens, length // 32, size)
    halves = lambda at: np.ascontiguousarray(blocks[:, :, at:at + 2]).view(np.float16)[..., 0].astype(np.float32)
    prepared = PreparedInput(tokens, length, True, False)
    prepared.num_tokens = tokens
    prepared.xd = halves(0)
    prepared.xs = halves(2) if size == 36 else np.zeros_like(prepared.xd)
    prepared.xq = np.ascontiguousarray(blocks[:, :, size - 32:]).view(np.int8).reshape(tokens, length)
    return raw, prepared


@pytest.mark.parametrize("case", GGML_FIXTURE["cases"],
                         ids=[f"{c['quant']}-{c['rows']}x{c['length']}-T{c['tokens']}" for c in GGML_FIXTURE["cases"]])
def test_kernels_equal_llama_cpp_vec_dot(case, threading):
    """Bit-equal to llama.cpp's own ggml_vec_dot_q4_1_q8_1 / ggml_vec_dot_q8_0_q8_0 (AVX2+FMA build),
    whose outputs make_ggml_matmul_fixture.py recorded: packed groups, tail rows, token tiles."""
    quant = {"Q4_1": Q4_1, "Q8_0": Q8_0}[case["quant"]]
    raw, prepared = _ggml_case_inputs(case)
    want = np.array(case["out"], np.uint32).view(np.float32).reshape(case["tokens"], case["rows"])
    out = np.full(want.shape, np.nan, np.float32)
    QuantizedLinear("w", raw, quant, case["length"]).apply(prepared, out)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(_gguf_reference_kernel(raw, quant, prepared), want)
    np.testing.assert_array_equal(_scalar_reference(raw, quant, prepared), want)


@pytest.mark.parametrize("quant", [Q4_0, Q4_1, Q8_0], ids=lambda q: q.name)
@pytest.mark.parametrize("rows", [0, 5, 8, 21])
def test_repack_keeps_every_byte(quant, rows):
    raw = _raw(quant, max(rows, 1), 96, seed=rows)[:rows]
    packed, tail = repack(raw, quant)
    assert packed.nbytes + tail.nbytes == raw.nbytes
    np.testing.assert_array_equal(unpack(packed, tail, quant), raw)


@pytest.mark.parametrize("rows", [8, 21])
def test_gathered_packed_q8_0_rows_equal_dequantized_gguf_rows(rows):
    raw = _raw(Q8_0, rows, 96, seed=rows)
    packed, tail = repack(raw, Q8_0)
    wanted = np.array([0, rows - 1, 3, 7, rows // 2, 3], np.int32)       # group rows, tail rows, repeats
    out = np.full((len(wanted), 96), np.nan, np.float32)
    gather_rows_q8_0(packed, tail, wanted, HALF_TO_FLOAT, out)
    np.testing.assert_array_equal(out, dequantize(raw, Q8_0)[wanted])


@pytest.mark.parametrize("quant", [Q4_0, Q4_1, Q8_0], ids=lambda q: q.name)
@pytest.mark.parametrize("part_rows", [(64, 16, 16), (24, 13), (8, 8, 8), (13, 8)])
@pytest.mark.parametrize("tokens", [1, 6])
def test_fused_linear_equals_separate_parts(quant, part_rows, tokens, threading):
    length = 128
    parts = [QuantizedLinear(f"p{i}", _raw(quant, rows, length, seed=i), quant, length) for i, rows in enumerate(part_rows)]
    prepared = _prepared(tokens, length, seed=7)
    separate = [np.zeros((tokens, p.out_features), np.float32) for p in parts]
    for part, out in zip(parts, separate):
        part.apply(prepared, out)
    fused = FusedLinear(parts)
    assert fused.fused == all(rows % 8 == 0 for rows in part_rows[:-1])
    outs = [np.full((tokens, p.out_features), np.nan, np.float32) for p in parts]
    fused.apply(prepared, outs)
    for got, want, part in zip(outs, separate, parts):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, _scalar_reference(part.raw, quant, prepared))
    for part, out in zip(parts, separate):         # the parts still work alone (packed are views)
        again = np.zeros_like(out)
        part.apply(prepared, again)
        np.testing.assert_array_equal(again, out)
    if fused.fused:                                 # fusing the same parts again copies nothing
        assert FusedLinear(parts).packed.ctypes.data == fused.packed.ctypes.data


def test_fused_linear_of_float_weights_applies_parts():
    rng = np.random.default_rng(3)
    w = [rng.standard_normal((n, 64)).astype(np.float32) for n in (16, 8)]
    parts = [QuantizedLinear("a", quantize(w[0], F32), F32, 64), QuantizedLinear("b", quantize(w[1], F16), F16, 64)]
    fused = FusedLinear(parts)
    assert not fused.fused and fused.needs_half
    x = rng.standard_normal((3, 64)).astype(np.float32)
    prepared = PreparedInput(3, 64, fused.needs_q8, fused.needs_half).prepare(x)
    outs = [np.zeros((3, 16), np.float32), np.zeros((3, 8), np.float32)]
    fused.apply(prepared, outs)
    np.testing.assert_allclose(outs[0], x @ w[0].T, rtol=1e-5, atol=1e-5)
    half = x.astype(np.float16).astype(np.float64) @ w[1].astype(np.float16).astype(np.float64).T
    np.testing.assert_allclose(outs[1], half, rtol=1e-4, atol=1e-4)


def test_apply_rejects_wrong_output():
    linear = QuantizedLinear("w", _raw(Q4_1, 16, 64, seed=1), Q4_1, 64)
    prepared = _prepared(2, 64, seed=1)
    with pytest.raises(ValueError, match="shape"):
        linear.apply(prepared, np.zeros((2, 15), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        linear.apply(prepared, np.zeros((16, 2), np.float32).T)


def test_release_file_pages_only_touches_file_mappings(tmp_path):
    raw = _raw(Q4_1, 4096, 64, seed=5)
    path = tmp_path / "w.bin"
    path.write_bytes(b"\0" * 100 + raw.tobytes())
    with open(path, "rb") as handle:
        mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    view = np.frombuffer(memoryview(mapping), np.uint8, count=raw.size, offset=100).reshape(raw.shape)
    linear = QuantizedLinear("w", view, Q4_1, 64)            # repacks, then releases the pages
    assert release_file_pages(view)
    np.testing.assert_array_equal(view, raw)                 # pages come back from the file
    in_memory = raw.copy()
    assert not release_file_pages(in_memory)
    np.testing.assert_array_equal(in_memory, raw)
    assert linear.nbytes == raw.nbytes
    del view, linear


_GENERIC_CHECK = textwrap.dedent("""
    import numpy as np
    from test_matmul import _scalar_reference, _prepared, _raw
    from edge_slm_node.model import linear
    from edge_slm_node.model.linear import QuantizedLinear
    from edge_slm_node.model.quant import Q4_0, Q4_1, Q8_0
    for quant, limit in ((Q4_0, 0), (Q4_1, 0), (Q8_0, 0), (Q4_0, 1 << 62), (Q4_1, 1 << 62), (Q8_0, 1 << 62)):
        linear.PARALLEL_MIN_BYTES = linear.PARALLEL_MIN_MACS = limit
        for rows, length, tokens in ((13, 64, 1), (37, 576, 17)):
            raw = _raw(quant, rows, length, seed=rows)
            prepared = _prepared(tokens, length, seed=tokens)
            out = np.zeros((tokens, rows), np.float32)
            QuantizedLinear("w", raw, quant, length).apply(prepared, out)
            assert np.array_equal(out, _scalar_reference(raw, quant, prepared)), (quant.name, rows, length, tokens)
    print("generic ok")
""")


def test_generic_vector_code_without_avx2_is_bit_equal():
    """The non-x86 / pre-AVX2 code path, compiled for a generic x86-64 CPU in a subprocess."""
    path = os.pathsep.join([REPO_ROOT, os.path.join(REPO_ROOT, "test", "kernels")])
    env = dict(os.environ, NUMBA_CPU_NAME="generic", PYTHONPATH=path)
    result = subprocess.run([sys.executable, "-c", _GENERIC_CHECK], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "generic ok" in result.stdout, result.stderr[-3000:]
