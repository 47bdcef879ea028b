"""Element-wise and normalisation kernels of the transformer block (float32).

Numerics follow llama.cpp's CPU backend (x86, AVX2 + FMA build) operation by operation, so
that greedy decoding picks the same tokens: where its compiler fuses a*b+c into one FMA we
call `fma_f32`, and its vectorised exp (ggml_v_expf, a polynomial, not libm's expf) is
stated for one lane in `exp_f32` (checked against llama.cpp's own outputs; the kernels use its
8-lane form, vec8.exp). Swapping either for the "obvious" formula changes logits by up to ~0.4
on SmolLM2-135M (see test/model/test_llama_cpp_fidelity.py).
Note: numba's cache does not notice edits to functions inlined from other modules (hsum8 and
bits_float in kernels/attention.py, simd/vec8 here); clear kernels/__pycache__ after changing them.
"""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from . import simd, vec8

F32 = np.float32


# ------------------------------------------------------------------ scalar float32 primitives

@intrinsic
def fma_f32(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma.f32), all float32."""
    if not all(isinstance(x, types.Float) and x.bitwidth == 32 for x in (a, b, c)):
        return None

    def codegen(context, builder, sig, args):
        name = "llvm.fma.f32"
        fn = builder.module.globals.get(name)
        if fn is None:
            fn = ir.Function(builder.module, ir.FunctionType(ir.FloatType(), [ir.FloatType()] * 3), name=name)
        return builder.call(fn, args)
    return types.float32(types.float32, types.float32, types.float32), codegen


@intrinsic
def float_bits(typingctx, x):
    """float32 -> its int32 bit pattern."""
    if not (isinstance(x, types.Float) and x.bitwidth == 32):
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


@intrinsic
def bits_float(typingctx, x):
    """Integer whose low 32 bits are a float32 bit pattern -> that float32."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        value = args[0]
        if sig.args[0].bitwidth > 32:
            value = builder.trunc(value, ir.IntType(32))
        elif sig.args[0].bitwidth < 32:
            value = builder.sext(value, ir.IntType(32))
        return builder.bitcast(value, ir.FloatType())
    return types.float32(x), codegen


# ggml_v_expf constants (ARM optimized-routines polynomial; max error 1.45 ulp + 0.5 ulp)
_ROUND = F32(float.fromhex("0x1.8p23"))
_LOG2E = F32(float.fromhex("0x1.715476p+0"))
_LN2_HI = F32(float.fromhex("0x1.62e4p-1"))
_LN2_LO = F32(float.fromhex("0x1.7f7d1cp-20"))
_C0 = F32(float.fromhex("0x1.0e4020p-7"))
_C1 = F32(float.fromhex("0x1.573e2ep-5"))
_C2 = F32(float.fromhex("0x1.555e66p-3"))
_C3 = F32(float.fromhex("0x1.fffdb6p-2"))
_C4 = F32(float.fromhex("0x1.ffffecp-1"))
_ONE_BITS = np.int32(0x3F800000)
_SCALE_BIAS = np.int32(0x7F000000)
_NEGATIVE_SCALE = np.int32(-0x7E000000)          # 0x82000000 as int32


@njit(cache=True, inline="always")
def exp_f32(x):
    """float32 exp exactly as one lane of llama.cpp's ggml_v_expf (AVX2 + FMA); exp(-inf) = 0."""
    z = fma_f32(x, _LOG2E, _ROUND)
    n = z - _ROUND
    b = fma_f32(-n, _LN2_LO, fma_f32(-n, _LN2_HI, x))
    e = float_bits(z) << np.int32(23)
    k = bits_float(e + _ONE_BITS)
    u = b * b
    j = fma_f32(fma_f32(fma_f32(_C0, b, _C1), u, fma_f32(_C2, b, _C3)), u, _C4 * b)
    if not abs(n) > F32(126.0):
        return fma_f32(j, k, k)
    g = _NEGATIVE_SCALE if n <= F32(0.0) else np.int32(0)
    s1 = bits_float(g + _SCALE_BIAS)
    if abs(n) > F32(192.0):
        return s1 * s1
    s2 = bits_float(e - g)
    return fma_f32(s2, j, s2) * s1


@njit(cache=True, inline="always")
def exp_wide_f32(x):
    """float32 exp exactly as one lane of ggml_v_expf in llama.cpp's AVX-512 build: the same
    reduction as exp_f32, then j = fma(poly, u, fma(c4, b, 1)) scaled by 2^n exactly
    (_mm512_scalef_ps, one rounding); |n| > 192 gives 0 or inf."""
    z = fma_f32(x, _LOG2E, _ROUND)
    n = z - _ROUND
    b = fma_f32(-n, _LN2_LO, fma_f32(-n, _LN2_HI, x))
    u = b * b
    j = fma_f32(fma_f32(fma_f32(_C0, b, _C1), u, fma_f32(_C2, b, _C3)), u, fma_f32(_C4, b, F32(1.0)))
    if abs(n) > F32(192.0):
        return F32(0.0) if n <= F32(0.0) else F32(np.inf)
    whole = np.int32(n)
    half = whole >> np.int32(1)
    rest = whole - half
    return (j * bits_float((half + np.int32(127)) << np.int32(23))) * bits_float((rest + np.int32(127)) << np.int32(23))


@njit(cache=True, inline="always")
def hsum8(v, at):
    """Horizontal sum of the 8 floats v[at:at+8] in the order of llama.cpp's hsum_float_8."""
    a0 = v[at + 4] + v[at]
    a1 = v[at + 5] + v[at + 1]
    a2 = v[at + 6] + v[at + 2]
    a3 = v[at + 7] + v[at + 3]
    return (a0 + a2) + (a1 + a3)


# --------------------------------------------------------------------------------- kernels

@njit(cache=True, nogil=True)
def rms_norm(x, weight, eps, out):
    """x (T, n) f32, weight (n,) -> out (T, n) = x / sqrt(mean(x^2) + eps) * weight.

    As ggml: each square rounded to float32, summed in float64 in order; scale in float32. Rows
    go four at a time, their sums as four independent chains (one chain waits on each add)."""
    num_tokens, n = x.shape
    quads = num_tokens - num_tokens % 4
    for t in range(0, quads, 4):
        total0 = total1 = total2 = total3 = 0.0
        for i in range(n):
            total0 += np.float64(x[t, i] * x[t, i])
            total1 += np.float64(x[t + 1, i] * x[t + 1, i])
            total2 += np.float64(x[t + 2, i] * x[t + 2, i])
            total3 += np.float64(x[t + 3, i] * x[t + 3, i])
        _scale_row(x[t], weight, eps, total0, out[t])
        _scale_row(x[t + 1], weight, eps, total1, out[t + 1])
        _scale_row(x[t + 2], weight, eps, total2, out[t + 2])
        _scale_row(x[t + 3], weight, eps, total3, out[t + 3])
    for t in range(quads, num_tokens):
        total = 0.0
        for i in range(n):
            total += np.float64(x[t, i] * x[t, i])
        _scale_row(x[t], weight, eps, total, out[t])


@njit(cache=True, inline="always")
def _scale_row(row, weight, eps, total, out):
    """out = row / sqrt(total / n + eps) * weight, as ggml_compute_forward_rms_norm_f32."""
    n = row.shape[0]
    mean = np.float32(total / n)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    for i in range(n):
        out[i] = (row[i] * scale) * weight[i]


@njit(cache=True, nogil=True)
def add_in_place(x, y):
    """x (T, n) += y (T, n)."""
    num_tokens, n = x.shape
    for t in range(num_tokens):
        for i in range(n):
            x[t, i] += y[t, i]


@njit(cache=True, nogil=True)
def scale_in_place(x, factor):
    """x (T, n) *= factor (float32; ggml_scale)."""
    num_tokens, n = x.shape
    for t in range(num_tokens):
        for i in range(n):
            x[t, i] *= factor


@njit(cache=True, nogil=True)
def add_bias(x, bias):
    """x (T, n) += bias (n,)."""
    num_tokens, n = x.shape
    for t in range(num_tokens):
        for i in range(n):
            x[t, i] += bias[i]


@njit(cache=True, nogil=True)
def silu_mul(gate, up, out, avx512=False, first=0, last=-1):
    """gate, up (T, n) C-contiguous -> out (T, n) = gate * sigmoid(gate) * up (ggml_vec_swiglu_f32),
    in columns first..last-1 only (last < 0: to n; first a multiple of 16).

    Groups of 8 as its AVX2 loop (of 16 as its AVX-512 loop if avx512), (g / (1 + exp(0 - g))) * up
    with that build's vector exp; a row's last n % 8 (n % 16) values as its scalar tail, with libm's expf."""
    num_tokens, n = gate.shape
    last = n if last < 0 else last
    vector_end = n // 16 * 16 if avx512 else n // 8 * 8
    one, zero = simd.splat_f32(np.float32(1.0)), simd.zeros_f32x8()
    for t in range(num_tokens):
        gate_row, up_row, out_row = gate[t], up[t], out[t]
        for i in range(first, min(last, vector_end), 8):
            g = simd.load_f32x8(gate_row, i)
            e = vec8.exp_wide(vec8.sub(zero, g)) if avx512 else vec8.exp(vec8.sub(zero, g))
            silu = vec8.div(g, simd.add(one, e))
            simd.store_f32x8(out_row, i, simd.mul(silu, simd.load_f32x8(up_row, i)))
        for i in range(max(first, vector_end), last):
            g = gate[t, i]
            out[t, i] = g / (np.float32(1.0) + np.exp(-g)) * up[t, i]


def rope_tables(max_positions, rotary_dims, freq_base, freq_factors=None):
    """-> cos, sin (max_positions, rotary_dims/2) f32, theta stepped in float32 as ggml does;
    freq_factors (rotary_dims/2,) f32 (rope_freqs.weight, Llama 3.x): pair i's angle divided by it."""
    factors = np.zeros(0, np.float32) if freq_factors is None else np.ascontiguousarray(freq_factors, np.float32)
    if factors.shape[0] not in (0, rotary_dims // 2):
        raise ValueError(f"rope_freqs has {factors.shape[0]} factors, rotary_dims / 2 = {rotary_dims // 2}")
    return _rope_tables(max_positions, rotary_dims, freq_base, factors)


@njit(cache=True)
def _rope_tables(max_positions, rotary_dims, freq_base, factors):
    half = rotary_dims // 2
    cos = np.empty((max_positions, half), np.float32)
    sin = np.empty((max_positions, half), np.float32)
    theta_scale = np.float32(freq_base ** (-2.0 / rotary_dims))
    for p in range(max_positions):
        theta = np.float32(p)
        for i in range(half):
            angle = theta / factors[i] if factors.shape[0] > 0 else theta     # ggml_rope_cache_init
            cos[p, i] = np.float32(np.cos(angle))
            sin[p, i] = np.float32(np.sin(angle))
            theta = np.float32(theta * theta_scale)
    return cos, sin


@njit(cache=True, nogil=True)
def apply_rope(x, positions, cos, sin, neox):
    """x (T, heads, head_dim) rotated in place by positions (T,); neox pairs (i, i+d/2), else (2i, 2i+1).

    x0' = fma(x0, cos, -(x1 sin)), x1' = fma(x0, sin, x1 cos), as ggml's compiled rotate_pairs."""
    num_tokens, num_heads, head_dim = x.shape
    half = cos.shape[1]
    for t in range(num_tokens):
        p = positions[t]
        for h in range(num_heads):
            for i in range(half):
                if neox:
                    a, b = i, i + half
                else:
                    a, b = 2 * i, 2 * i + 1
                x0 = x[t, h, a]
                x1 = x[t, h, b]
                c, s = cos[p, i], sin[p, i]
                x[t, h, a] = fma_f32(x0, c, -(x1 * s))
                x[t, h, b] = fma_f32(x0, s, x1 * c)
