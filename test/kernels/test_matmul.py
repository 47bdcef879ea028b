"""Quantized matmuls (kernels/quants): packed kernels and their GGUF-layout tail rows bit-equal to
scalar references (Q4_1, Q8_0 in llama.cpp's summation order) and to llama.cpp itself, close to NumPy."""
import base64
import json
import mmap
import os
import platform
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import llvmlite.binding as llvm_binding
import numpy as np
import pytest
from numba import njit

from gguf.quants import quantize

from edge_slm_node.kernels.half import HALF_TO_FLOAT
from edge_slm_node.kernels.ops import fma_f32
from edge_slm_node.kernels.quantize import quantize_rows_q8, scaled_group_sums
from edge_slm_node.kernels.simd import EXACT_BIAS, STACK_ALIGNMENT, align_stack_frame
from edge_slm_node.kernels.quants import F16, F32, Q4_0, Q4_1, Q8_0, q4_0, q4_1, q6_k, q8_0
from edge_slm_node.kernels.quants.common import ROWS_PER_GROUP, new_scratch
from edge_slm_node.model.linear import FusedLinear, Linear, release_file_pages

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


class Quantized:
    """x (T, K) and its activations as the kernels quantize them (int8 q, f16-rounded d and d*sum(q))."""

    def __init__(self, x):
        self.x = x
        self.num_tokens, length = x.shape
        self.xq = np.zeros((self.num_tokens, length), np.int8)
        self.xd = np.zeros((self.num_tokens, length // 32), np.float32)
        self.xs = np.zeros_like(self.xd)
        quantize_rows_q8(x, self.xq, self.xd, self.xs)


def _scalar_reference(raw, quant, acts):
    out = np.zeros((acts.num_tokens, raw.shape[0]), np.float32)
    if quant is Q4_1:
        _llama_q4_1(raw, acts.xq, acts.xd, acts.xs, HALF_TO_FLOAT, out)
    elif quant is Q4_0:
        _simple_q4_0(raw, acts.xq, acts.xd, HALF_TO_FLOAT, out)
    else:
        _llama_q8_0(raw, acts.xq, acts.xd, HALF_TO_FLOAT, out)
    return out


@njit
def _rows_q4_1(raw, xq, xd, xs, out):
    for r in range(raw.shape[0]):
        for t in range(xd.shape[0]):
            out[t, r] = q4_1.row_dot(raw[r], xq[t], xd[t], xs[t])


@njit
def _rows_q4_0(raw, xq, xd, out):
    for r in range(raw.shape[0]):
        for t in range(xd.shape[0]):
            out[t, r] = q4_0.row_dot(raw[r], xq[t], xd[t])


@njit
def _rows_q8_0(raw, xq, xd, out):
    for r in range(raw.shape[0]):
        for t in range(xd.shape[0]):
            out[t, r] = q8_0.row_dot(raw[r], xq[t], xd[t])


def _gguf_row_kernel(raw, quant, acts):
    """Every row through the GGUF-layout row kernel the packed kernels use for their tail rows."""
    out = np.zeros((acts.num_tokens, raw.shape[0]), np.float32)
    if quant is Q4_1:
        _rows_q4_1(raw, acts.xq, acts.xd, acts.xs, out)
    elif quant is Q4_0:
        _rows_q4_0(raw, acts.xq, acts.xd, out)
    else:
        _rows_q8_0(raw, acts.xq, acts.xd, out)
    return out


def _numpy_reference(raw, quant, acts):
    """float64 dequantize(W) @ dequantized activations (+ Q4_1's m*xs term as the kernels use it);
    also returns |W| @ |x|, the scale of the rounding error a float32 accumulation may make."""
    weights = quant.dequantize(raw).astype(np.float64)
    blocks = acts.xd.shape[1]
    xq = acts.xq.astype(np.float64).reshape(acts.num_tokens, blocks, 32)
    x = (xq * acts.xd[:, :, None]).reshape(acts.num_tokens, -1)
    ref = x @ weights.T
    if quant is Q4_1:   # dequantize's m*sum(x) -> m*xs (xs = fp16(d*sum(q)), as the kernels use)
        m = raw.reshape(-1, 20)[:, 2:4].copy().view(np.float16).astype(np.float64).reshape(raw.shape[0], blocks)
        correction = acts.xs - acts.xd * xq.sum(axis=2)
        ref += correction @ m.T
    return ref, np.abs(x) @ np.abs(weights).T


def _x(tokens, length, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((tokens, length)) * rng.uniform(0.1, 3.0, (tokens, 1))).astype(np.float32)


def _raw(quant, rows, length, seed):
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((rows, length)).astype(np.float32) * rng.uniform(0.01, 1.0, (rows, 1))
    return quantize(weights.astype(np.float32), quant.ggml_type)


def _scratch(parts, tokens, length):
    return new_scratch(tokens, length, {slot for part in parts for slot in part.scratch_slots})


def _apply(linear, x, parallel):
    out = np.full((x.shape[0], linear.out_features), np.nan, np.float32)
    linear.apply(x, _scratch([linear], *x.shape), out, parallel)
    return out


@pytest.mark.parametrize("quant", [Q4_0, Q4_1, Q8_0], ids=lambda q: q.name)
@pytest.mark.parametrize("rows", [1, 7, 8, 13, 37])
@pytest.mark.parametrize("length", [32, 64, 576, 1536])
@pytest.mark.parametrize("tokens", [1, 3, 17])
@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
def test_kernels_bit_equal_to_scalar_reference(quant, rows, length, tokens, parallel):
    raw = _raw(quant, rows, length, seed=rows * 1000 + length)
    x = _x(tokens, length, seed=tokens)
    acts = Quantized(x)
    out = _apply(Linear("w", raw, quant, length), x, parallel)
    expected = _scalar_reference(raw, quant, acts)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(_gguf_row_kernel(raw, quant, acts), expected)
    ref, scale = _numpy_reference(raw, quant, acts)
    assert np.all(np.abs(out - ref) <= 1e-3 * np.abs(ref) + 1e-5 * scale)


@pytest.mark.parametrize("quant", [Q4_0, Q4_1, Q8_0], ids=lambda q: q.name)
def test_thread_pool_split_is_bit_equal(quant):
    """Big enough for matmul_parallel to split its row groups over the thread pool."""
    rows, length, tokens = 261, 1536, 17                        # 6.8M multiply-adds, a 5-row tail
    raw = _raw(quant, rows, length, seed=11)
    x = _x(tokens, length, seed=12)
    linear = Linear("w", raw, quant, length)
    np.testing.assert_array_equal(_apply(linear, x, True), _apply(linear, x, False))
    np.testing.assert_array_equal(_apply(linear, x[:1], True), _scalar_reference(raw, quant, Quantized(x[:1])))


GGML_FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "ggml_matmul_fixture.json").read_text())


def _ggml_case_inputs(case):
    """The fixture's GGUF weight bytes and ggml's own Q8_1 / Q8_0 activation blocks."""
    rows, length, tokens = case["rows"], case["length"], case["tokens"]
    raw = np.frombuffer(base64.b64decode(case["weights"]), np.uint8).reshape(rows, -1).copy()
    size = 36 if case["quant"] == "Q4_1" else 34          # block_q8_1: d, s, qs[32]; block_q8_0: d, qs[32]
    blocks = np.frombuffer(base64.b64decode(case["activations"]), np.uint8).reshape(tokens, length // 32, size)
    halves = lambda at: np.ascontiguousarray(blocks[:, :, at:at + 2]).view(np.float16)[..., 0].astype(np.float32)
    acts = Quantized(np.zeros((tokens, length), np.float32))
    acts.xd = halves(0)
    acts.xs = halves(2) if size == 36 else np.zeros_like(acts.xd)
    acts.xq = np.ascontiguousarray(blocks[:, :, size - 32:]).view(np.int8).reshape(tokens, length)
    return raw, acts


@pytest.mark.parametrize("case", GGML_FIXTURE["cases"],
                         ids=[f"{c['quant']}-{c['rows']}x{c['length']}-T{c['tokens']}" for c in GGML_FIXTURE["cases"]])
def test_kernels_equal_llama_cpp_vec_dot(case):
    """Bit-equal to llama.cpp's own ggml_vec_dot_q4_1_q8_1 / ggml_vec_dot_q8_0_q8_0 (AVX2+FMA build),
    whose outputs make_ggml_matmul_fixture.py recorded: packed groups, tail rows, token tiles. The
    fixture holds ggml's quantized activations, so the kernels' row groups run on those directly."""
    quant = {"Q4_1": Q4_1, "Q8_0": Q8_0}[case["quant"]]
    raw, acts = _ggml_case_inputs(case)
    want = np.array(case["out"], np.uint32).view(np.float32).reshape(case["tokens"], case["rows"])
    linear = Linear("w", raw, quant, case["length"])
    out = np.full(want.shape, np.nan, np.float32)
    empty = np.zeros((0, 0), np.float32)
    if quant is Q4_1:
        packed_acts = (acts.xq, acts.xd, acts.xs)
    else:
        offsets = np.empty((case["tokens"], case["length"] // 4), np.int32)
        scaled_group_sums(acts.xq, -128, EXACT_BIAS, offsets)
        packed_acts = (acts.xq, offsets, acts.xd)
    module = quant.kernels
    module._groups(0, linear.packed.shape[0], linear.packed, packed_acts, (out, empty, empty), linear.part_ends)
    module._tail(linear.tail, packed_acts, (out, empty, empty), linear.part_ends)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(_gguf_row_kernel(raw, quant, acts), want)
    np.testing.assert_array_equal(_scalar_reference(raw, quant, acts), want)


def _unpack(packed, tail, quant):
    """Inverse of the type's pack: packed groups + tail -> GGUF rows."""
    scale_bytes = {Q4_1: 4, Q4_0: 2, Q8_0: 2}[quant]
    chunk = {Q4_1: 8, Q4_0: 4, Q8_0: 8}[quant]
    size, rows = quant.type_size, ROWS_PER_GROUP
    blocks = packed.shape[1] // (rows * size)
    p = packed.reshape(packed.shape[0], blocks, rows * size)
    halves = p[..., :scale_bytes * rows].reshape(-1, blocks, scale_bytes // 2, rows, 2).transpose(0, 1, 3, 2, 4)
    payload = p[..., scale_bytes * rows:].reshape(-1, blocks, (size - scale_bytes) // chunk, rows, chunk)
    block = np.concatenate([halves.reshape(-1, blocks, rows, scale_bytes),
                            payload.transpose(0, 1, 3, 2, 4).reshape(-1, blocks, rows, size - scale_bytes)], axis=3)
    return np.concatenate([block.transpose(0, 2, 1, 3).reshape(-1, blocks * size), tail], axis=0)


@pytest.mark.parametrize("quant", [Q4_0, Q4_1, Q8_0], ids=lambda q: q.name)
@pytest.mark.parametrize("rows", [0, 5, 8, 21])
def test_repack_keeps_every_byte(quant, rows):
    raw = _raw(quant, max(rows, 1), 96, seed=rows)[:rows]
    packed, tail = quant.kernels.pack(raw)
    assert packed.nbytes + tail.nbytes == raw.nbytes
    np.testing.assert_array_equal(_unpack(packed, tail, quant), raw)


@pytest.mark.parametrize("rows", [8, 21])
def test_gathered_packed_q8_0_rows_equal_dequantized_gguf_rows(rows):
    raw = _raw(Q8_0, rows, 96, seed=rows)
    packed, tail = Q8_0.kernels.pack(raw)
    wanted = np.array([0, rows - 1, 3, 7, rows // 2, 3], np.int32)       # group rows, tail rows, repeats
    out = np.full((len(wanted), 96), np.nan, np.float32)
    q8_0.gather_rows(packed, tail, wanted, out)
    np.testing.assert_array_equal(out, Q8_0.dequantize(raw)[wanted])
    q8_0.embed_rows(raw, wanted, out)
    np.testing.assert_array_equal(out, Q8_0.dequantize(raw)[wanted])


@pytest.mark.parametrize("quant", [Q4_0, Q4_1, Q8_0], ids=lambda q: q.name)
@pytest.mark.parametrize("part_rows", [(64, 16, 16), (24, 13), (8, 8, 8), (13, 8)])
@pytest.mark.parametrize("tokens", [1, 6])
@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
def test_fused_linear_equals_separate_parts(quant, part_rows, tokens, parallel):
    length = 128
    parts = [Linear(f"p{i}", _raw(quant, rows, length, seed=i), quant, length) for i, rows in enumerate(part_rows)]
    x = _x(tokens, length, seed=7)
    separate = [_apply(part, x, parallel) for part in parts]
    fused = FusedLinear(parts)
    assert fused.fused == all(rows % 8 == 0 for rows in part_rows[:-1])
    outs = [np.full((tokens, p.out_features), np.nan, np.float32) for p in parts]
    fused.apply(x, _scratch(parts, tokens, length), outs, parallel)
    for got, want, part in zip(outs, separate, parts):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, _scalar_reference(part.raw, quant, Quantized(x)))
    for part, out in zip(parts, separate):         # the parts still work alone (packed are views)
        np.testing.assert_array_equal(_apply(part, x, parallel), out)
    if fused.fused:                                 # fusing the same parts again copies nothing
        assert FusedLinear(parts).packed.ctypes.data == fused.packed.ctypes.data


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
def test_float_weights_apply_part_by_part(parallel):
    rng = np.random.default_rng(3)
    w = [rng.standard_normal((n, 64)).astype(np.float32) for n in (16, 8)]
    stored = [quantize(w[0], F32.ggml_type).view(np.uint8), quantize(w[1], F16.ggml_type).view(np.uint8)]
    parts = [Linear("a", stored[0], F32, 64), Linear("b", stored[1], F16, 64)]
    fused = FusedLinear(parts)
    assert not fused.fused
    x = rng.standard_normal((3, 64)).astype(np.float32)
    outs = [np.zeros((3, 16), np.float32), np.zeros((3, 8), np.float32)]
    fused.apply(x, _scratch(parts, 3, 64), outs, parallel)
    np.testing.assert_allclose(outs[0], x @ w[0].T, rtol=1e-5, atol=1e-5)
    half = x.astype(np.float16).astype(np.float64) @ w[1].astype(np.float16).astype(np.float64).T
    np.testing.assert_allclose(outs[1], half, rtol=1e-4, atol=1e-4)


def test_apply_rejects_wrong_shapes():
    linear = Linear("w", _raw(Q4_1, 16, 64, seed=1), Q4_1, 64)
    x = _x(2, 64, seed=1)
    scratch = _scratch([linear], 2, 64)
    with pytest.raises(ValueError, match="shape"):
        linear.apply(x, scratch, np.zeros((2, 15), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        linear.apply(x, scratch, np.zeros((16, 2), np.float32).T)
    with pytest.raises(ValueError, match="input"):
        linear.apply(_x(2, 32, seed=1), scratch, np.zeros((2, 16), np.float32))


def test_release_file_pages_only_touches_file_mappings(tmp_path):
    raw = _raw(Q4_1, 4096, 64, seed=5)
    path = tmp_path / "w.bin"
    path.write_bytes(b"\0" * 100 + raw.tobytes())
    with open(path, "rb") as handle:
        mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    view = np.frombuffer(memoryview(mapping), np.uint8, count=raw.size, offset=100).reshape(raw.shape)
    linear = Linear("w", view, Q4_1, 64)                     # repacks, then releases the pages
    assert release_file_pages(view)
    np.testing.assert_array_equal(view, raw)                 # pages come back from the file
    in_memory = raw.copy()
    assert not release_file_pages(in_memory)
    np.testing.assert_array_equal(in_memory, raw)
    assert linear.nbytes == raw.nbytes
    del view, linear


_GENERIC_CHECK = textwrap.dedent("""
    import numpy as np
    from test_matmul import Quantized, _apply, _raw, _scalar_reference, _x
    from edge_slm_node.kernels.quants import Q4_0, Q4_1, Q8_0
    from edge_slm_node.model.linear import Linear
    for quant in (Q4_0, Q4_1, Q8_0):
        for rows, length, tokens in ((13, 64, 1), (37, 576, 17), (261, 1536, 17)):
            raw = _raw(quant, rows, length, seed=rows)
            x = _x(tokens, length, seed=tokens)
            for parallel in (False, True):
                out = _apply(Linear("w", raw, quant, length), x, parallel)
                assert np.array_equal(out, _scalar_reference(raw, quant, Quantized(x))), (quant.name, rows, tokens)
    print("generic ok")
""")


@pytest.mark.parametrize("cpu", ["generic", "haswell"])
def test_vector_code_without_avx512_is_bit_equal(cpu):
    """The code paths of CPUs without AVX-512 or VNNI, compiled in a subprocess: "generic" x86-64
    (no AVX2: generic vector code, as on non-x86 machines) and "haswell" (AVX2 and FMA: the
    16-lane kernels split into 256-bit halves, the 4-byte dots without vpdpbusd)."""
    path = os.pathsep.join([REPO_ROOT, os.path.join(REPO_ROOT, "test", "kernels")])
    env = dict(os.environ, NUMBA_CPU_NAME=cpu, PYTHONPATH=path)
    result = subprocess.run([sys.executable, "-c", _GENERIC_CHECK], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0 and "generic ok" in result.stdout, result.stderr[-3000:]


@njit
def _with_aligned_frame(x):
    align_stack_frame()
    return x + 1.0


def _fresh_groups_code(module, block_bytes, acts, blocks=2):
    """module._groups compiled anew (the cached one keeps no IR) for 2 row groups of `blocks` blocks."""
    fresh = njit(module._groups.py_func)
    outs = (np.zeros((4, 16), np.float32),) * 3
    fresh(0, 2, np.zeros((2, blocks * block_bytes), np.uint8), acts, outs, np.array([2], np.int64))
    return "\n".join(fresh.inspect_llvm().values()), "\n".join(fresh.inspect_asm().values())


def test_tile_loops_run_on_aligned_stack_frames():
    """align_stack_frame marks its function alignstack(64) (llvmlite prints no attribute of an
    otherwise empty set, so the kernels would silently keep 16-byte frames), and the row-group
    loops of SmolLM2's weight types (Q4_1 layers, Q8_0 head) realign the stack pointer on entry:
    their 4-token tiles spill 64-byte registers, 3.2x slower off a cache line (simd.py)."""
    assert _with_aligned_frame(1.0) == 2.0
    assert f"alignstack({STACK_ALIGNMENT})" in "\n".join(_with_aligned_frame.inspect_llvm().values())
    x, scales = np.zeros((4, 64), np.int8), np.zeros((4, 2), np.float32)
    for module, block_bytes, acts in ((q4_1, 160, (x, scales, scales)),
                                      (q8_0, 272, (x, np.zeros((4, 16), np.int32), scales))):
        llvm, asm = _fresh_groups_code(module, block_bytes, acts)
        assert f"alignstack({STACK_ALIGNMENT})" in llvm, module.__name__
        if platform.machine() in ("x86_64", "AMD64"):
            assert f"andq\t$-{STACK_ALIGNMENT}, %rsp" in asm, module.__name__


def _loop_bodies(asm):
    """The x86 code between consecutive labels of a function's assembly -> list of instruction lists."""
    bodies, body = [], []
    for line in asm.splitlines():
        if re.match(r"^\.?[\w$.]+:", line):
            bodies.append(body)
            body = []
        elif line.startswith("\t") and not line.startswith("\t."):
            body.append(line.strip())
    return bodies + [body]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64")
                    or not llvm_binding.get_host_cpu_features().get("avx512vnni", False),
                    reason="the 4-token tiles are 16 vpdpbusd a block only with AVX-512 VNNI")
def test_tile_loops_keep_their_registers():
    """With LLVM's machine scheduler off (kernels/__init__.py) the 4-token tiles of SmolLM2's
    weight types (Q4_1 layers, Q8_0 head) keep their lanes and broadcasts in the 32 vector
    registers: the loop over blocks stores no vector register to the stack and reads none back.
    With the scheduler on, the same loops stored 11 (Q4_1) and 18 (Q8_0) vector registers to the
    stack every block and read them back, and the Q8_0 head ran 1.5x slower."""
    x, scales = np.zeros((4, 64), np.int8), np.zeros((4, 2), np.float32)
    for module, block_bytes, acts in ((q4_1, 160, (x, scales, scales)),
                                      (q8_0, 272, (x, np.zeros((4, 16), np.int32), scales))):
        _, asm = _fresh_groups_code(module, block_bytes, acts)
        tiles = [body for body in _loop_bodies(asm) if sum("vpdpbusd" in i and "zmm" in i for i in body) == 16]
        assert len(tiles) == 1, (module.__name__, len(tiles))
        spills = [i for i in tiles[0] if "zmm" in i and "(%rsp)" in i]
        assert spills == [], (module.__name__, spills)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64")
                    or not llvm_binding.get_host_cpu_features().get("avx512vnni", False),
                    reason="the Q6_K decode tile takes a pair of row groups only with AVX-512 VNNI")
def test_q6_k_decode_tile_keeps_the_multiply_pipe_for_multiplies():
    """The Q6_K 4-token decode tile (the 1.5B's output head and FFN down) joins its int16 dot
    pairs by shift and ternlog, and unpacks its 6-bit values by word shifts and masks: LLVM would
    otherwise emit vpermt2w and vgf2p8affineqb, which on Zen 4 share the pipe of vpdpbusd (a lane of
    4 tokens x 16 rows took 82 of that pipe's cycles instead of 56; simd_int.join_halves, _byte_shift)."""
    acts = (np.zeros((4, 256), np.int8), np.zeros((4, 1), np.float32), np.zeros((4, 16), np.int32),
            np.zeros(4, np.int32), np.zeros(4, np.int32))       # call lengths 0: every token alone
    _, asm = _fresh_groups_code(q6_k, q6_k.GROUP_BLOCK_BYTES, acts, blocks=1)
    tiles = [body for body in _loop_bodies(asm) if sum("vpdpbusd" in i and "zmm" in i for i in body) == 32]
    assert tiles, "no loop of 32 vpdpbusd (a lane of the 4-token pair tile)"
    shuffles = [i for body in tiles for i in body if i.startswith(("vpermt2w", "vpermi2w", "vgf2p8affineqb"))]
    assert shuffles == []
