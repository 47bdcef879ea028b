"""More operations on simd.F32x8 for the attention kernels: subtraction, max, broadcasts, the
horizontal sums, fp16 conversions and exp of llama.cpp's x86 build, each rounding exactly as
the scalar statement it names (kernels/half.py, kernels/ops.py), and the folds that reduce 16
vectors of 16 lanes at once (F32x16, the AVX-512 orders). Loads, stores, add, mul and splats of
F32x8 are in simd.py.

Indices are flat element indices from an array's first element (`arr.flat[index]` for
C-contiguous arrays, `arr.data[index]` for strided uint16 caches); nothing is bounds-checked.
"""
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .simd import F32x8, Vector, _pointer, _x86_call


_F32 = ir.FloatType()
_I32 = ir.IntType(32)
_V8F = ir.VectorType(_F32, 8)
_V8I = ir.VectorType(_I32, 8)
_V8H = ir.VectorType(ir.IntType(16), 8)


def _splat_const(vector_type, value):
    return ir.Constant(vector_type, [value] * vector_type.count)


def _f32_const(value):
    return _splat_const(_V8F, float(np.float32(value)))


def _is_f32_c(arr):
    return isinstance(arr, types.Array) and arr.layout == "C" and arr.dtype == types.float32


def _is_u16(arr):
    return isinstance(arr, types.Array) and arr.dtype == types.uint16


def _lanes(builder, v, indices):
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, len(indices)), list(indices)))


@intrinsic
def broadcast(typingctx, arr, index):
    """arr.flat[index] of a C-contiguous float32 array, 8 copies -> F32x8 (no negative-index wrap)."""
    if not (_is_f32_c(arr) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        x = builder.load(_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], _F32), align=4)
        first = builder.insert_element(ir.Constant(_V8F, None), x, ir.Constant(_I32, 0))
        return _lanes(builder, first, [0] * 8)
    return F32x8(arr, index), codegen


@intrinsic
def prefetch(typingctx, arr, index):
    """Hint: bring the cache line of arr.data[index] (element index) into L2 (prefetcht1)."""
    if not (isinstance(arr, types.Array) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        byte = ir.IntType(8)
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], byte)
        _x86_call(builder, "llvm.prefetch.p0", ir.VoidType(), [p, ir.Constant(_I32, 0), ir.Constant(_I32, 2),
                                                           ir.Constant(_I32, 1)])
        return context.get_dummy_value()
    return types.none(arr, index), codegen


def _binary(op):
    @intrinsic
    def fn(typingctx, a, b):
        if not (a == F32x8 and b == F32x8):
            return None

        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1])
        return F32x8(a, b), codegen
    return fn


sub = _binary("fsub")
div = _binary("fdiv")


@intrinsic
def maximum(typingctx, a, b):
    """Lane-wise max (order-free: the result does not depend on which operand is first)."""
    if not (a == F32x8 and b == F32x8):
        return None

    def codegen(context, builder, sig, args):
        return builder.select(builder.fcmp_ordered(">", args[0], args[1]), args[0], args[1])
    return F32x8(a, b), codegen


@intrinsic
def max_lane(typingctx, v):
    """Largest of the 8 lanes -> float32."""
    if v != F32x8:
        return None

    def codegen(context, builder, sig, args):
        best = builder.extract_element(args[0], ir.Constant(_I32, 0))
        for i in range(1, 8):
            x = builder.extract_element(args[0], ir.Constant(_I32, i))
            best = builder.select(builder.fcmp_ordered(">", x, best), x, best)
        return best
    return types.float32(v), codegen


def _hsum8_ir(builder, v):
    """hsum_float_8: a = v[4:8] + v[0:4]; (a0 + a2) + (a1 + a3)."""
    a = builder.fadd(_lanes(builder, v, [4, 5, 6, 7]), _lanes(builder, v, [0, 1, 2, 3]))
    b = builder.fadd(_lanes(builder, a, [0, 1]), _lanes(builder, a, [2, 3]))
    return builder.fadd(builder.extract_element(b, ir.Constant(_I32, 0)),
                        builder.extract_element(b, ir.Constant(_I32, 1)))


@intrinsic
def hsum(typingctx, v):
    """Sum of the 8 lanes in hsum_float_8's order -> float32."""
    if v != F32x8:
        return None

    def codegen(context, builder, sig, args):
        return _hsum8_ir(builder, args[0])
    return types.float32(v), codegen


@intrinsic
def reduce32(typingctx, a0, a1, a2, a3):
    """Sum of 4 vectors (lanes 0-7, 8-15, 16-23, 24-31) in ggml_vec_dot_f16's order -> float32."""
    if not all(a == F32x8 for a in (a0, a1, a2, a3)):
        return None

    def codegen(context, builder, sig, args):
        v = builder.fadd(builder.fadd(args[1], args[3]), builder.fadd(args[0], args[2]))
        t = builder.fadd(_lanes(builder, v, [4, 5, 6, 7]), _lanes(builder, v, [0, 1, 2, 3]))
        e = [builder.extract_element(t, ir.Constant(_I32, i)) for i in range(4)]
        return builder.fadd(builder.fadd(e[0], e[1]), builder.fadd(e[2], e[3]))
    return types.float32(a0, a1, a2, a3), codegen


@intrinsic
def keep_first(typingctx, v, n):
    """Lanes >= n set to 0."""
    if not (v == F32x8 and isinstance(n, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        count = context.cast(builder, args[1], sig.args[1], types.int32)
        first = builder.insert_element(ir.Constant(_V8I, None), count, ir.Constant(_I32, 0))
        keep = builder.icmp_signed("<", ir.Constant(_V8I, list(range(8))), _lanes(builder, first, [0] * 8))
        return builder.select(keep, args[0], _f32_const(0.0))
    return F32x8(v, n), codegen


@intrinsic
def load_half(typingctx, arr, index):
    """8 fp16 bit patterns at arr.data[index:index+8] (uint16, contiguous there) -> F32x8, exactly
    as half.half_bits_to_float (((h & 0x7FFF) << 13 | sign << 16) * 2^112)."""
    if not (_is_u16(arr) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        # sign-extended h << 13: bit 31 = sign, bits 30-28 = sign copies (cleared), 27-13 = h & 0x7FFF
        h = builder.sext(builder.load(_pointer(context, builder, sig.args[0], args[0], sig.args[1],
                                                       args[1], _V8H), align=2), _V8I)
        bits = builder.and_(builder.shl(h, _splat_const(_V8I, 13)), _splat_const(_V8I, -0x70000001))   # 0x8FFFFFFF
        return builder.fmul(builder.bitcast(bits, _V8F), _f32_const(2.0 ** 112))
    return F32x8(arr, index), codegen


def _to_half_ir(builder, v):
    """F32x8 -> fp16 bits <8 x i16>: round to nearest even, overflow -> inf, NaN -> 0x7E00 | sign."""
    bits = builder.bitcast(builder.fptrunc(v, ir.VectorType(ir.HalfType(), 8)), _V8H)
    sign = builder.trunc(builder.lshr(builder.bitcast(v, _V8I), _splat_const(_V8I, 16)), _V8H)
    nan_bits = builder.or_(builder.and_(sign, _splat_const(_V8H, 0x8000)), _splat_const(_V8H, 0x7E00))
    return builder.select(builder.fcmp_unordered("uno", v, v), nan_bits, bits)


@intrinsic
def store_half(typingctx, arr, index, v):
    """arr.data[index:index+8] = fp16 bits of v, exactly as half.float_to_half_bits."""
    if not (_is_u16(arr) and isinstance(index, types.Integer) and v == F32x8):
        return None

    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], _V8H)
        builder.store(_to_half_ir(builder, args[2]), p, align=2)
        return context.get_dummy_value()
    return types.none(arr, index, v), codegen


@intrinsic
def round_half(typingctx, v):
    """Each lane rounded to fp16 precision (nearest even; overflow -> inf), as half.round_to_half."""
    if v != F32x8:
        return None

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], ir.VectorType(ir.HalfType(), 8)), _V8F)
    return F32x8(v), codegen


# ggml_v_expf constants, as ops.exp_f32
_EXP = {name: float.fromhex(h) for name, h in [
    ("round", "0x1.8p23"), ("log2e", "0x1.715476p+0"), ("ln2_hi", "0x1.62e4p-1"), ("ln2_lo", "0x1.7f7d1cp-20"),
    ("c0", "0x1.0e4020p-7"), ("c1", "0x1.573e2ep-5"), ("c2", "0x1.555e66p-3"), ("c3", "0x1.fffdb6p-2"),
    ("c4", "0x1.ffffecp-1")]}


@intrinsic
def exp(typingctx, v):
    """ops.exp_f32 (ggml_v_expf) on 8 lanes. Lanes with |n| > 126 take the special path only when
    there are any, as ggml branches: computed always, its 2^-125 squared underflows, and an Intel
    core takes a microcode assist for each such product (exp of a negative number: every softmax
    and SiLU vector; silu_mul took ~7x as long on the Xeon host of 2026-12-05)."""
    if v != F32x8:
        return None

    def codegen(context, builder, sig, args):
        def fma(a, b, c):
            return _x86_call(builder, "llvm.fma.v8f32", _V8F, [a, b, c])

        def c(name):
            return _f32_const(_EXP[name])
        x = args[0]
        z = fma(x, c("log2e"), c("round"))
        n = builder.fsub(z, c("round"))
        minus_n = builder.fneg(n)
        b = fma(minus_n, c("ln2_lo"), fma(minus_n, c("ln2_hi"), x))
        e = builder.shl(builder.bitcast(z, _V8I), _splat_const(_V8I, 23))
        k = builder.bitcast(builder.add(e, _splat_const(_V8I, 0x3F800000)), _V8F)
        u = builder.fmul(b, b)
        j = fma(fma(fma(c("c0"), b, c("c1")), u, fma(c("c2"), b, c("c3"))), u, builder.fmul(c("c4"), b))
        normal = fma(j, k, k)
        abs_n = _x86_call(builder, "llvm.fabs.v8f32", _V8F, [n])
        is_special = builder.fcmp_ordered(">", abs_n, _f32_const(126.0))
        result = cgutils.alloca_once_value(builder, normal)
        any_special = builder.icmp_unsigned("!=", builder.bitcast(is_special, ir.IntType(8)), ir.Constant(ir.IntType(8), 0))
        with builder.if_then(any_special, likely=False):
            g = builder.select(builder.fcmp_ordered("<=", n, _f32_const(0.0)), _splat_const(_V8I, -0x7E000000),
                               _splat_const(_V8I, 0))
            s1 = builder.bitcast(builder.add(g, _splat_const(_V8I, 0x7F000000)), _V8F)
            s2 = builder.bitcast(builder.sub(e, g), _V8F)
            special = builder.select(builder.fcmp_ordered(">", abs_n, _f32_const(192.0)), builder.fmul(s1, s1),
                                     builder.fmul(fma(s2, j, s2), s1))
            builder.store(builder.select(is_special, special, normal), result)
        return builder.load(result)
    return F32x8(v), codegen


@intrinsic
def exp_wide(typingctx, v):
    """ops.exp_wide_f32 (ggml_v_expf of the AVX-512 build) on 8 lanes, its branches as selects."""
    if v != F32x8:
        return None

    def codegen(context, builder, sig, args):
        def fma(a, b, c):
            return _x86_call(builder, "llvm.fma.v8f32", _V8F, [a, b, c])

        def c(name):
            return _f32_const(_EXP[name])
        x = args[0]
        z = fma(x, c("log2e"), c("round"))
        n = builder.fsub(z, c("round"))
        minus_n = builder.fneg(n)
        b = fma(minus_n, c("ln2_lo"), fma(minus_n, c("ln2_hi"), x))
        u = builder.fmul(b, b)
        j = fma(fma(fma(c("c0"), b, c("c1")), u, fma(c("c2"), b, c("c3"))), u, fma(c("c4"), b, _f32_const(1.0)))
        # scalef(j, n) = j * 2^n rounded once: 2^(n - n/2) and 2^(n/2) are normal for |n| <= 192,
        # and j * 2^(n/2) is exact (j is near 1), so only the second product rounds.
        whole = builder.fptosi(n, _V8I)
        half = builder.ashr(whole, _splat_const(_V8I, 1))
        rest = builder.sub(whole, half)
        bias = _splat_const(_V8I, 127)
        power = lambda e: builder.bitcast(builder.shl(builder.add(e, bias), _splat_const(_V8I, 23)), _V8F)
        scaled = builder.fmul(builder.fmul(j, power(half)), power(rest))
        abs_n = _x86_call(builder, "llvm.fabs.v8f32", _V8F, [n])
        limit = builder.select(builder.fcmp_ordered("<=", n, _f32_const(0.0)), _f32_const(0.0),
                               _f32_const(float("inf")))
        return builder.select(builder.fcmp_ordered(">", abs_n, _f32_const(192.0)), limit, scaled)
    return F32x8(v), codegen


# ------------------------------------------------- 16 sums of 16 lanes at once (AVX-512 orders)
# reduce_16's order on 16 lanes l: a_i = l[8+i] + l[i], then ((a4 + a0) + (a6 + a2)) + ((a5 + a1) +
# (a7 + a3)): sums of lanes 8, then 4, 2 and 1 apart. A fold adds lanes `distance` apart within
# every source of two vectors at once (each shuffle one vshuff64x2 or vshufps): 16 vectors of
# lanes -> fold_8 -> 8 -> fold_4 -> 4 -> fold_2 -> 2 -> fold_1 -> one vector of their 16 sums, each
# in reduce_16's order. With leaf s (the s-th vector in pairing order) holding source
# FOLD_LEAF_ORDER[s], lane p of the result is source p's sum.

def _fold_quarters(a, b, c, d):
    return [4 * a + i for i in range(4)] + [4 * b + i for i in range(4)] + \
        [16 + 4 * c + i for i in range(4)] + [16 + 4 * d + i for i in range(4)]


def _fold_within(i0, i1, i2, i3):
    return [4 * k + i for k in range(4) for i in (i0, i1, 16 + i2, 16 + i3)]


FOLD_MASKS = {   # distance -> the two shuffles of (x, y) whose sum adds lanes that far apart
    8: (list(range(8)) + list(range(16, 24)), list(range(8, 16)) + list(range(24, 32))),
    4: (_fold_quarters(0, 2, 0, 2), _fold_quarters(1, 3, 1, 3)),
    2: (_fold_within(0, 1, 0, 1), _fold_within(2, 3, 2, 3)),
    1: (_fold_within(0, 2, 0, 2), _fold_within(1, 3, 1, 3)),
}
FOLD_LEAF_ORDER = tuple(4 * (s % 4) + s // 4 for s in range(16))


def _fold(distance):
    wide = Vector("f32", 16)
    first, second = FOLD_MASKS[distance]

    @intrinsic
    def fold(typingctx, x, y):
        if not (x == wide and y == wide):
            return None

        def codegen(context, builder, sig, args):
            mask = ir.VectorType(_I32, 16)
            a = builder.shuffle_vector(args[0], args[1], ir.Constant(mask, first))
            b = builder.shuffle_vector(args[0], args[1], ir.Constant(mask, second))
            return builder.fadd(b, a)
        return wide(x, y), codegen
    fold.__doc__ = f"F32x16 x, y -> their lanes {distance} apart added within each source (see FOLD_MASKS)."
    return fold


fold_8, fold_4, fold_2, fold_1 = _fold(8), _fold(4), _fold(2), _fold(1)
