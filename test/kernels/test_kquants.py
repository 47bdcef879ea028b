"""Q5_0, Q5_1, Q4_K, Q5_K, Q6_K (kernels/quants): NumPy dequantizers equal gguf-py's on real
Qwen2.5-Coder tensors (random blocks where those files hold no such type); packed kernels and
their GGUF-layout tail rows bit-equal to scalar references of llama.cpp's summation orders,
close to a float64 product, and bit-equal to llama.cpp's own outputs (ggml_kquant_fixture.json)."""
import base64
import json
from pathlib import Path

import numpy as np
import pytest
from numba import njit

import gguf
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import Q4_K as GGUF_Q4_K, dequantize, quantize

from edge_slm_node.kernels.ops import fma_f32
from edge_slm_node.kernels.quantize import quantize_rows_q8, quantize_rows_q8_k
from edge_slm_node.kernels.quants import Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, UnsupportedQuantError, quant_type
from edge_slm_node.kernels.quants.common import new_scratch
from edge_slm_node.model.gguf_file import GGUFError, GGUFFile
from edge_slm_node.model.linear import FusedLinear, Linear

MODELS = Path.home() / ".cache" / "edge_slm_node" / "models"
SMALL = MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
LARGE = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
NEW_TYPES = [Q5_0, Q5_1, Q4_K, Q5_K, Q6_K]
# (file, tensor) holding each type in the two Qwen2.5-Coder Q4_K_M files
MODEL_TENSORS = [(SMALL, "blk.0.attn_q.weight", Q5_0), (SMALL, "token_embd.weight", Q5_0),
                 (SMALL, "blk.2.ffn_down.weight", Q4_K), (SMALL, "blk.0.ffn_down.weight", Q6_K),
                 (LARGE, "token_embd.weight", Q4_K), (LARGE, "blk.0.attn_v.weight", Q6_K),
                 (LARGE, "output.weight", Q6_K)]
MODEL_IDS = [f"{path.name.split('-')[2]}-{name}" for path, name, _ in MODEL_TENSORS]


def _model_rows(path, name, rows):
    if not path.is_file():
        pytest.skip(f"{path.name} is not installed (see README, models)")
    gguf_file = GGUFFile(str(path))
    raw = gguf_file.tensor_bytes(name)
    pick = np.unique(np.linspace(0, raw.shape[0] - 1, rows).astype(int))
    return np.array(raw[pick]), gguf_file.tensors[name].quant


def _random_rows(quant, rows, length, seed):
    """Random weights: quantized by gguf-py where it can (Q5_0, Q5_1), else random blocks
    (uniform bytes, fp16 scales in a realistic range) for the K-quants."""
    rng = np.random.default_rng(seed)
    if quant in (Q5_0, Q5_1):
        weights = rng.standard_normal((rows, length)) * rng.uniform(0.01, 1.0, (rows, 1))
        return quantize(weights.astype(np.float32), quant.ggml_type)
    blocks = length // 256
    raw = rng.integers(0, 256, (rows, blocks, quant.type_size), dtype=np.uint8)
    halves = lambda: rng.uniform(1e-4, 3e-3, (rows, blocks)).astype(np.float16).view(np.uint8).reshape(rows, blocks, 2)
    if quant is Q6_K:
        raw[:, :, 208:210] = halves()
    else:
        raw[:, :, 0:2], raw[:, :, 2:4] = halves(), halves()
    return raw.reshape(rows, -1)


def _x(tokens, length, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, length)) * rng.uniform(0.1, 3.0, (tokens, 1))
    x[:, :4] *= 20                                   # outlier channels, as in Qwen's activations
    return x.astype(np.float32)


# ------------------------------------------------------------------ dequantizers vs gguf-py

@pytest.mark.parametrize("path,name,quant", MODEL_TENSORS, ids=MODEL_IDS)
def test_dequantize_equals_gguf_on_model_tensors(path, name, quant):
    raw, stored = _model_rows(path, name, 12)
    assert stored is quant
    np.testing.assert_array_equal(quant.dequantize(raw), dequantize(raw, quant.ggml_type))


@pytest.mark.parametrize("quant", NEW_TYPES, ids=lambda q: q.name)
def test_dequantize_equals_gguf_on_random_blocks(quant):
    raw = _random_rows(quant, 9, 512, seed=1)
    np.testing.assert_array_equal(quant.dequantize(raw), dequantize(raw, quant.ggml_type))


@pytest.mark.parametrize("quant", NEW_TYPES, ids=lambda q: q.name)
def test_embedding_rows_equal_dequantized_rows(quant):
    raw = _random_rows(quant, 21, 512, seed=2)
    wanted = np.array([0, 20, 3, 7, 10, 3], np.int32)
    out = np.full((len(wanted), 512), np.nan, np.float32)
    quant.kernels.embed_rows(raw, wanted, out)
    np.testing.assert_array_equal(out, quant.dequantize(raw)[wanted])


# -------------------------------------- scalar references of llama.cpp's orders (x86 builds)
# Integers unpacked with NumPy from the GGUF layout (gguf-py's scale decoding), floats summed one
# value at a time in the order of: ggml_vec_dot_q5_0_q8_0 / _q5_1_q8_1 / _q5_K_q8_K / _q6_K_q8_K
# (AVX2; 8 lanes of 4-weight groups), ggml_gemv/gemm_q4_K_8x8_q8_K (repacked Q4_K: once per
# super-block / per pair of sub-blocks) and the tiled K-quant matmul (Q5_K, Q6_K, >= 8 tokens).

def _halves(raw, block, at):
    return raw.reshape(raw.shape[0], -1, block)[:, :, at:at + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _unpack(raw, quant):
    """-> (q (rows, K) int32 unsigned codes, d, second scale (m / dmin or zeros) (rows, nb),
    sub-block scales (rows, nb, ·) int32, sub-block mins (rows, nb, 8) int32)."""
    rows = raw.shape[0]
    b = raw.reshape(rows, -1, quant.type_size)
    if quant in (Q5_0, Q5_1):
        at = 2 if quant is Q5_0 else 4
        qh = b[:, :, at:at + 4].copy().view(np.uint32)[..., 0]
        high = (qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1
        qs = b[:, :, at + 4:at + 20]
        low = np.concatenate([qs & 15, qs >> 4], axis=2).astype(np.uint32)
        q = (low | (high << 4)).astype(np.int32).reshape(rows, -1)
        second = _halves(raw, quant.type_size, 2) if quant is Q5_1 else np.zeros(b.shape[:2], np.float32)
        return q, _halves(raw, quant.type_size, 0), second, None, None
    if quant is Q6_K:
        ql = b[:, :, :128].reshape(rows, -1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
        qh = b[:, :, 128:192].reshape(rows, -1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)
        q = ((ql & 15).reshape(rows, -1, 8, 32) | ((qh & 3).reshape(rows, -1, 8, 32) << 4)).astype(np.int32)
        scales = b[:, :, 192:208].view(np.int8).astype(np.int32)
        return q.reshape(rows, -1), _halves(raw, 210, 208), np.zeros(b.shape[:2], np.float32), scales, None
    sc, mins = GGUF_Q4_K.get_scale_min(b[:, :, 4:16].reshape(-1, 12))
    sc, mins = sc.astype(np.int32).reshape(rows, -1, 8), mins.astype(np.int32).reshape(rows, -1, 8)
    start = 16 if quant is Q4_K else 48
    qs = b[:, :, start:start + 128].reshape(rows, -1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
    q = (qs & 15).reshape(rows, -1, 8, 32).astype(np.int32)
    if quant is Q5_K:
        qh = b[:, :, 16:48].reshape(rows, -1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
        q |= ((qh & 1) << 4).astype(np.int32)
    return q.reshape(rows, -1), _halves(raw, quant.type_size, 0), _halves(raw, quant.type_size, 2), sc, mins


@njit
def _hsum(lanes):
    return ((lanes[4] + lanes[0]) + (lanes[6] + lanes[2])) + ((lanes[5] + lanes[1]) + (lanes[7] + lanes[3]))


@njit
def _lanes32(q, x, offset, at):
    """8 exact lane sums over one 32-weight block at `at`: lane l = sum_e (q - offset) * x over 4l+e."""
    out = np.zeros(8, np.int64)
    for lane in range(8):
        for e in range(4):
            out[lane] += (q[at + 4 * lane + e] - offset) * np.int64(x[at + 4 * lane + e])
    return out


@njit
def _ref_q5(q, d, m, xq, xd, xs, q5_1, out):
    lanes = np.zeros(8, np.float32)
    for r in range(q.shape[0]):
        for t in range(xq.shape[0]):
            lanes[:] = 0
            summs = np.float32(0.0)
            for b in range(d.shape[1]):
                dd = d[r, b] * xd[t, b]
                if q5_1:
                    summs = fma_f32(m[r, b], xs[t, b], summs)
                isums = _lanes32(q[r], xq[t], 0 if q5_1 else 16, 32 * b)
                for lane in range(8):
                    lanes[lane] = fma_f32(dd, np.float32(isums[lane]), lanes[lane])
            out[t, r] = _hsum(lanes) + summs


@njit
def _ref_q4_k(q, d, dmin, sc, mins, xq, xd, bsums, out):
    tiled_tokens = xq.shape[0] // 4 * 4
    for r in range(q.shape[0]):
        for t in range(xq.shape[0]):
            acc = acc_min = np.float32(0.0)
            for b in range(d.shape[1]):
                dd, dm = d[r, b] * xd[t, b], dmin[r, b] * xd[t, b]
                s_block = m_block = 0
                for j in range(4):
                    s_pair = m_pair = 0
                    for h in range(2):
                        sub = 2 * j + h
                        dot = 0
                        for i in range(32):
                            dot += q[r, 256 * b + 32 * sub + i] * np.int64(xq[t, 256 * b + 32 * sub + i])
                        s_pair += sc[r, b, sub] * dot
                        m_pair += mins[r, b, sub] * (bsums[t, 16 * b + 2 * sub] + bsums[t, 16 * b + 2 * sub + 1])
                    if t < tiled_tokens:                # gemm: once per pair of sub-blocks
                        acc = fma_f32(np.float32(s_pair), dd, acc)
                        acc_min = fma_f32(np.float32(m_pair), dm, acc_min)
                    s_block += s_pair
                    m_block += m_pair
                if t >= tiled_tokens:                   # gemv: once per super-block
                    acc = fma_f32(np.float32(s_block), dd, acc)
                    acc_min = fma_f32(np.float32(m_block), dm, acc_min)
            out[t, r] = acc - acc_min


@njit
def _ref_q5_k(q, d, dmin, sc, mins, xq, xd, bsums, out):
    lanes = np.zeros(8, np.float32)
    tiled = xq.shape[0] >= 8
    for r in range(q.shape[0]):
        for t in range(xq.shape[0]):
            lanes[:] = 0
            summs = acc = np.float32(0.0)
            for b in range(d.shape[1]):
                m_block = 0
                for sub in range(8):
                    m_block += mins[r, b, sub] * (bsums[t, 16 * b + 2 * sub] + bsums[t, 16 * b + 2 * sub + 1])
                s_lanes = np.zeros(8, np.int64)
                for sub in range(8):
                    isums = _lanes32(q[r], xq[t], 0, 256 * b + 32 * sub)
                    for lane in range(8):
                        s_lanes[lane] += sc[r, b, sub] * isums[lane]
                if tiled:
                    scaled = np.float32(s_lanes.sum()) * d[r, b]
                    acc = fma_f32(fma_f32(-np.float32(m_block), dmin[r, b], scaled), xd[t, b], acc)
                else:
                    summs = fma_f32(-xd[t, b] * dmin[r, b], np.float32(m_block), summs)
                    for lane in range(8):
                        lanes[lane] = fma_f32(xd[t, b] * d[r, b], np.float32(s_lanes[lane]), lanes[lane])
            out[t, r] = acc if tiled else _hsum(lanes) + summs


@njit
def _ref_q6_k(q, d, sc, xq, xd, bsums, out):
    lanes = np.zeros(8, np.float32)
    tiled = xq.shape[0] >= 8
    for r in range(q.shape[0]):
        for t in range(xq.shape[0]):
            lanes[:] = 0
            acc = np.float32(0.0)
            for b in range(d.shape[1]):
                s_lanes = np.zeros(8, np.int64)
                for v in range(8):
                    isums = _lanes32(q[r], xq[t], 0, 256 * b + 32 * v)
                    for lane in range(8):
                        s_lanes[lane] += sc[r, b, 2 * v + lane // 4] * isums[lane]
                for lane in range(8):
                    s_lanes[lane] -= 32 * (sc[r, b, 2 * lane] * bsums[t, 16 * b + 2 * lane]
                                           + sc[r, b, 2 * lane + 1] * bsums[t, 16 * b + 2 * lane + 1])
                    lanes[lane] = fma_f32(xd[t, b] * d[r, b], np.float32(s_lanes[lane]), lanes[lane])
                acc = fma_f32(np.float32(s_lanes.sum()) * d[r, b], xd[t, b], acc)
            out[t, r] = acc if tiled else _hsum(lanes)


class Activations:
    """x (T, K) quantized as the kernels quantize it for `quant` (Q8_0 / Q8_1 / Q8_K)."""

    def __init__(self, x, quant):
        tokens, length = x.shape
        self.q = np.zeros((tokens, length), np.int8)
        if quant.block_size == 256:
            self.d = np.zeros((tokens, length // 256), np.float32)
            self.bsums = np.zeros((tokens, length // 16), np.int32)
            quantize_rows_q8_k(x, self.q, self.d, self.bsums)
            self.values = (self.q.reshape(tokens, -1, 256) * self.d[:, :, None].astype(np.float64)).reshape(tokens, -1)
        else:
            self.d = np.zeros((tokens, length // 32), np.float32)
            self.s = np.zeros_like(self.d)
            quantize_rows_q8(x, self.q, self.d, self.s)
            self.values = (self.q.reshape(tokens, -1, 32) * self.d[:, :, None].astype(np.float64)).reshape(tokens, -1)


def llama_reference(raw, quant, acts):
    """llama.cpp's result for every (token, row) from the GGUF bytes and the quantized activations."""
    out = np.zeros((acts.q.shape[0], raw.shape[0]), np.float32)
    q, d, second, sc, mins = _unpack(raw, quant)
    if quant in (Q5_0, Q5_1):
        _ref_q5(q, d, second, acts.q, acts.d, acts.s, quant is Q5_1, out)
    elif quant is Q4_K:
        _ref_q4_k(q, d, second, sc, mins, acts.q, acts.d, acts.bsums, out)
    elif quant is Q5_K:
        _ref_q5_k(q, d, second, sc, mins, acts.q, acts.d, acts.bsums, out)
    else:
        _ref_q6_k(q, d, sc, acts.q, acts.d, acts.bsums, out)
    return out


def float64_reference(raw, quant, acts):
    """float64 dequantize(W) @ dequantized activations (+ Q5_1's m * s term as the kernels use
    it: s = fp16(d * sum(q))), and |W| @ |x|, the scale of a float32 accumulation's rounding."""
    weights = quant.dequantize(raw).astype(np.float64)
    ref = acts.values @ weights.T
    if quant is Q5_1:
        m = _halves(raw, 24, 2).astype(np.float64)
        ref += (acts.s - acts.d * acts.q.reshape(acts.q.shape[0], -1, 32).sum(axis=2)) @ m.T
    return ref, np.abs(acts.values) @ np.abs(weights).T


def _apply(linear, x, parallel):
    out = np.full((x.shape[0], linear.out_features), np.nan, np.float32)
    linear.apply(x, new_scratch(x.shape[0], x.shape[1], set(linear.scratch_slots)), out, parallel)
    return out


LENGTHS = {Q5_0: [32, 224, 896], Q5_1: [32, 224, 896], Q4_K: [256, 768], Q5_K: [256, 768], Q6_K: [256, 768]}
CASES = [(quant, length) for quant in NEW_TYPES for length in LENGTHS[quant]]


@pytest.mark.parametrize("quant,length", CASES, ids=[f"{q.name}-K{n}" for q, n in CASES])
@pytest.mark.parametrize("rows", [1, 8, 13, 37])
@pytest.mark.parametrize("tokens", [1, 3, 6, 9])
@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
def test_kernels_bit_equal_to_llama_order_and_close_to_float64(quant, length, rows, tokens, parallel):
    raw = _random_rows(quant, rows, length, seed=rows * 1000 + length)
    x = _x(tokens, length, seed=tokens)
    acts = Activations(x, quant)
    out = _apply(Linear("w", raw, quant, length), x, parallel)
    np.testing.assert_array_equal(out, llama_reference(raw, quant, acts))
    ref, scale = float64_reference(raw, quant, acts)
    assert np.all(np.abs(out - ref) <= 1e-5 * scale + 1e-30)


@pytest.mark.parametrize("path,name,quant", MODEL_TENSORS[::2], ids=MODEL_IDS[::2])
@pytest.mark.parametrize("tokens", [1, 9])
def test_kernels_on_model_rows(path, name, quant, tokens):
    raw, _ = _model_rows(path, name, 19)                       # two row groups and a 3-row tail
    length = raw.shape[1] // quant.type_size * quant.block_size
    x = _x(tokens, length, seed=4)
    acts = Activations(x, quant)
    out = _apply(Linear("w", raw, quant, length), x, True)
    np.testing.assert_array_equal(out, llama_reference(raw, quant, acts))
    ref, scale = float64_reference(raw, quant, acts)
    assert np.all(np.abs(out - ref) <= 1e-5 * scale + 1e-30)


@pytest.mark.parametrize("quant", NEW_TYPES, ids=lambda q: q.name)
def test_thread_pool_split_is_bit_equal(quant):
    """Big enough for matmul_parallel to split its row groups over the thread pool."""
    rows, length, tokens = 261, 1536, 17                       # 6.8M multiply-adds, a 5-row tail
    raw = _random_rows(quant, rows, length, seed=11)
    x = _x(tokens, length, seed=12)
    linear = Linear("w", raw, quant, length)
    np.testing.assert_array_equal(_apply(linear, x, True), _apply(linear, x, False))
    np.testing.assert_array_equal(_apply(linear, x[:1], True), llama_reference(raw, quant, Activations(x[:1], quant)))


@pytest.mark.parametrize("quant", [Q4_K, Q5_K, Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
def test_each_token_is_summed_in_the_order_of_its_own_call(quant, parallel):
    """Tokens of eight llama.cpp calls (9 prompt tokens, 1 decoded, 5 prompt tokens, 5 more
    decoded: 8 tokens in the gemv's order, so two 4-token tiles of them), shuffled into one kernel
    call with their call shapes: each row equals that token's row when its own call runs alone.
    29 rows: a pair of row groups (16-lane tiles with AVX512-VNNI), a group alone and 5 tail rows."""
    raw = _random_rows(quant, 29, 768, seed=5)
    linear = Linear("w", raw, quant, 768)
    calls = [_x(9, 768, seed=1), _x(1, 768, seed=2), _x(5, 768, seed=3)] + [_x(1, 768, seed=6 + k) for k in range(5)]
    alone = [_apply(linear, x, parallel) for x in calls]
    tokens = [(c, i) for c, x in enumerate(calls) for i in range(len(x))]
    order = np.random.default_rng(0).permutation(len(tokens))
    mixed = np.stack([calls[tokens[k][0]][tokens[k][1]] for k in order])
    scratch = new_scratch(len(order), 768, set(linear.scratch_slots))
    scratch.call_index[:len(order)] = [tokens[k][1] for k in order]
    scratch.call_length[:len(order)] = [len(calls[tokens[k][0]]) for k in order]
    out = np.full((len(order), 29), np.nan, np.float32)
    empty = np.zeros((0, 0), np.float32)
    linear.kernel(parallel)(linear.packed, linear.tail, linear.part_ends, mixed, scratch, (out, empty, empty))
    expected = np.stack([alone[tokens[k][0]][tokens[k][1]] for k in order])
    np.testing.assert_array_equal(out, expected)
    assert not np.array_equal(alone[0][:5], _apply(linear, calls[0][:5], parallel))   # the orders do differ


@pytest.mark.parametrize("quant", NEW_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("part_rows", [(64, 16, 16), (24, 13), (13, 8)])
@pytest.mark.parametrize("tokens", [1, 9])
def test_fused_linear_equals_separate_parts(quant, part_rows, tokens):
    length = 512 if quant.block_size == 256 else 96
    parts = [Linear(f"p{i}", _random_rows(quant, rows, length, seed=i), quant, length) for i, rows in enumerate(part_rows)]
    x = _x(tokens, length, seed=7)
    separate = [_apply(part, x, True) for part in parts]
    fused = FusedLinear(parts)
    assert fused.fused == all(rows % 8 == 0 for rows in part_rows[:-1])
    outs = [np.full((tokens, p.out_features), np.nan, np.float32) for p in parts]
    fused.apply(x, new_scratch(tokens, length, set(quant.kernels.SCRATCH_SLOTS)), outs, True)
    for got, want in zip(outs, separate):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("quant", NEW_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("rows", [0, 5, 8, 21])
def test_packed_form_is_the_stored_size(quant, rows):
    raw = _random_rows(quant, max(rows, 1), 512, seed=rows)[:rows]
    packed, tail = quant.kernels.pack(raw)
    assert packed.nbytes + tail.nbytes == raw.nbytes
    np.testing.assert_array_equal(tail, raw[rows // 8 * 8:])


# ------------------------------------------------------- llama.cpp's own outputs (ctypes fixture)

GGML_FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "ggml_kquant_fixture.json").read_text())


def _fixture_case(case):
    quant = {q.name: q for q in NEW_TYPES}[case["quant"]]
    rows, length, tokens = case["rows"], case["length"], case["tokens"]
    raw = np.frombuffer(base64.b64decode(case["weights"]), np.uint8).reshape(rows, -1).copy()
    x = np.frombuffer(base64.b64decode(case["x"]), np.float32).reshape(tokens, length).copy()
    blocks = np.frombuffer(base64.b64decode(case["activations"]), np.uint8).reshape(tokens, -1)
    return quant, raw, x, blocks


def _ggml_activation_bytes(acts, quant):
    """Our quantized activations as ggml's block_q8_0 / block_q8_1 / block_q8_K bytes."""
    tokens = acts.q.shape[0]
    if quant.block_size == 256:
        parts = [acts.d.reshape(tokens, -1, 1).view(np.uint8), acts.q.reshape(tokens, -1, 256).view(np.uint8),
                 acts.bsums.astype(np.int16).reshape(tokens, -1, 16).view(np.uint8)]
    else:
        half = lambda v: v.astype(np.float16).reshape(tokens, -1, 1).view(np.uint8)
        parts = [half(acts.d)] + ([half(acts.s)] if quant is Q5_1 else []) + [acts.q.reshape(tokens, -1, 32).view(np.uint8)]
    return np.concatenate(parts, axis=2).reshape(tokens, -1)


@pytest.mark.parametrize("case", GGML_FIXTURE["cases"],
                         ids=[f"{c['quant']}-{c['rows']}x{c['length']}-T{c['tokens']}" for c in GGML_FIXTURE["cases"]])
def test_kernels_equal_llama_cpp_itself(case):
    """Bit-equal to llama.cpp's quantize_row_q8_* and ggml_vec_dot_* (and for Q4_K, which its x86
    build repacks, ggml_gemm/gemv_q4_K_8x8_q8_K), as make_ggml_kquant_fixture.py recorded them."""
    quant, raw, x, blocks = _fixture_case(case)
    acts = Activations(x, quant)
    np.testing.assert_array_equal(_ggml_activation_bytes(acts, quant), blocks)
    key = "repacked_out" if quant is Q4_K else "vec_dot_out"
    want = np.array(case[key], np.uint32).view(np.float32).reshape(case["tokens"], case["rows"])
    np.testing.assert_array_equal(_apply(Linear("w", raw, quant, case["length"]), x, False), want)
    np.testing.assert_array_equal(llama_reference(raw, quant, acts), want)


# ---------------------------------------------------------------- types the engine cannot run

@pytest.mark.parametrize("ggml_type", [GGMLQuantizationType.Q2_K, GGMLQuantizationType.Q3_K,
                                       GGMLQuantizationType.IQ4_XS, GGMLQuantizationType.IQ2_XXS])
def test_unsupported_type_names_the_type_the_tensor_and_the_supported_ones(ggml_type):
    with pytest.raises(UnsupportedQuantError) as error:
        quant_type(int(ggml_type), "blk.3.ffn_down.weight")
    message = str(error.value)
    assert ggml_type.name in message and "'blk.3.ffn_down.weight'" in message
    assert all(q.name in message for q in NEW_TYPES)
    with pytest.raises(UnsupportedQuantError, match="unknown type id 250"):
        quant_type(250, "x")


def test_gguf_file_with_an_unsupported_type_is_rejected_by_name(tmp_path):
    """A real GGUF (written by gguf-py) holding one Q3_K tensor: opening it names type and tensor."""
    path = tmp_path / "q3k.gguf"
    writer = GGUFWriter(str(path), "llama")
    block_bytes = gguf.GGML_QUANT_SIZES[GGMLQuantizationType.Q3_K][1]
    writer.add_tensor("blk.0.ffn_down.weight", np.zeros((4, block_bytes), np.uint8), raw_dtype=GGMLQuantizationType.Q3_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFError, match=r"'blk\.0\.ffn_down\.weight' is stored as Q3_K.*supported: .*Q4_K"):
        GGUFFile(str(path))


_GENERIC_CHECK = """
import numpy as np
from test_kquants import Activations, NEW_TYPES, _apply, _random_rows, _x, llama_reference
from edge_slm_node.model.linear import Linear
for quant in NEW_TYPES:
    length = 512 if quant.block_size == 256 else 224
    for rows, tokens in ((13, 1), (21, 9)):
        raw, x = _random_rows(quant, rows, length, seed=rows), _x(tokens, length, seed=tokens)
        for parallel in (False, True):
            out = _apply(Linear("w", raw, quant, length), x, parallel)
            assert np.array_equal(out, llama_reference(raw, quant, Activations(x, quant))), (quant.name, rows, tokens)
print("bit-equal")
"""


def _cpu_flags() -> set:
    try:
        return set(next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split(":")[1].split())
    except (OSError, StopIteration):
        return set()


@pytest.mark.parametrize("cpu", ["generic", "haswell", pytest.param("alderlake", marks=pytest.mark.skipif(
    "avx_vnni" not in _cpu_flags(), reason="this CPU cannot run AVX-VNNI code"))])
def test_vector_code_for_older_cpus_is_bit_equal(cpu):
    """The code paths of CPUs without AVX-512, compiled in a subprocess: "generic" x86-64 (no AVX2,
    no VNNI: the generic vector code), "haswell" (AVX2 and FMA, as on most controllers) and
    "alderlake" (256-bit AVX-VNNI), 8-lane kernels only, whatever this machine has."""
    import os
    import subprocess
    import sys
    repo = Path(__file__).parents[2]
    env = dict(os.environ, NUMBA_CPU_NAME=cpu,
               PYTHONPATH=os.pathsep.join([str(repo), str(repo / "test" / "kernels"), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", _GENERIC_CHECK], cwd=repo, env=env, capture_output=True, text=True,
                            timeout=1800)
    assert result.returncode == 0 and "bit-equal" in result.stdout, result.stderr[-3000:]
