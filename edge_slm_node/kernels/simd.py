"""SIMD primitives for the packed matmuls: numba intrinsics over LLVM vector types.

On x86 with AVX2 they use pmaddubsw / pmaddwd / vcvtph2ps; elsewhere the same semantics are
emitted as generic LLVM vector code (slower, still exact). All integer sums are exact for the
value ranges used: nibble (0..15) x int8 pairs <= 2*15*128 in int16, int8 x int8 pairs in
int32. Float ops are IEEE float32 and never contracted: `mul` and `add` round each result,
`fma` rounds once (llvm.fma: vfmadd on FMA CPUs, an exact software fma elsewhere);
`add_exact_product` is for products known to be exact (fused or not, the same bits).
Note: numba's cache does not notice edits to this file; clear __pycache__ after changing it.
"""
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model


# ---------------------------------------------------------------------- vector types (numba)

class Vector(types.Type):
    """An LLVM vector value held in registers, e.g. Vector('i16', 16)."""

    def __init__(self, kind: str, count: int):
        self.kind = kind
        self.count = count
        super().__init__(name=f"Vector({kind}x{count})")


_ELEMENT = {"i8": ir.IntType(8), "i16": ir.IntType(16), "i32": ir.IntType(32), "i64": ir.IntType(64),
            "f32": ir.FloatType()}


@register_model(Vector)
class _VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(_ELEMENT[fe_type.kind], fe_type.count))


I8x32 = Vector("i8", 32)
I8x64 = Vector("i8", 64)
I16x16 = Vector("i16", 16)
I32x8 = Vector("i32", 8)
F32x8 = Vector("f32", 8)

_I32 = ir.IntType(32)


def _vec(kind, count):
    return ir.VectorType(_ELEMENT[kind], count)


def _const(kind, count, value):
    return ir.Constant(_vec(kind, count), [value] * count)


def _has_features(context, *features) -> bool:
    """True when numba compiles for an x86 CPU with all of `features` (e.g. 'avx2')."""
    try:
        enabled = context.codegen()._tm_features.split(",")
    except AttributeError:                              # unknown numba internals: stay generic
        return False
    return all(f"+{f}" in enabled for f in features)


def _is_byte_row(arr) -> bool:
    return (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C"
            and arr.dtype in (types.uint8, types.int8))


def _pointer(context, builder, arr_type, arr, index_type, index, element_type):
    """&arr[index] (byte-addressed for u8/i8 arrays, element-addressed otherwise) as element_type*."""
    data = context.make_array(arr_type)(context, builder, arr).data
    position = context.cast(builder, index, index_type, types.intp)
    return builder.bitcast(builder.gep(data, [position]), element_type.as_pointer())


def _splat(builder, scalar, vector_type):
    empty = ir.Constant(vector_type, None)
    first = builder.insert_element(empty, scalar, ir.Constant(_I32, 0))
    return builder.shuffle_vector(first, empty, ir.Constant(ir.VectorType(_I32, vector_type.count), [0] * vector_type.count))


def _pair_sums(builder, wide, count):
    """Vector of 2*count lanes -> count lanes, lane i = lane 2i + lane 2i+1."""
    mask = ir.VectorType(_I32, count)
    even = builder.shuffle_vector(wide, wide, ir.Constant(mask, list(range(0, 2 * count, 2))))
    odd = builder.shuffle_vector(wide, wide, ir.Constant(mask, list(range(1, 2 * count, 2))))
    return builder.add(even, odd)


def _x86_call(builder, name, result_type, args):
    fn_type = ir.FunctionType(result_type, [a.type for a in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, fn_type, name), args)


# ------------------------------------------------------------------------- stack frames

STACK_ALIGNMENT = 64     # one cache line: a 64-byte register spilled there never spans two


@intrinsic
def align_stack_frame(typingctx):
    """Give the compiled function this is called in (after numba's inlining) a stack frame
    aligned to STACK_ALIGNMENT bytes.

    Why: LLVM keeps the x86 ABI's 16-byte stack alignment, so a loop that spills 64-byte
    registers (the 4-token tiles) stores and reloads them 16, 32 or 48 bytes off a cache line
    whenever the caller's stack happens to sit there: each reload then spans two lines and is
    not forwarded from its store. Which depth a call lands at depends on the calling thread and
    its stack (the address-space layout), so the same kernel ran 3.2x slower in some processes
    and threads than in others (README, "Stack alignment"); alignstack makes every call aligned."""
    def codegen(context, builder, sig, args):
        attributes = builder.function.attributes
        attributes.alignstack = STACK_ALIGNMENT
        attributes.add("uwtable")    # llvmlite prints no attributes, alignstack included, for an empty set
        return context.get_dummy_value()
    return types.none(), codegen


# ------------------------------------------------------------ float vectors, loads and stores

@intrinsic
def load_halves_as_f32(typingctx, arr, index):
    """8 fp16 values in the 16 little-endian bytes arr[index:index+16] -> F32x8 (exact)."""
    if not (_is_byte_row(arr) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        if _has_features(context, "f16c"):
            p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], ir.VectorType(ir.HalfType(), 8))
            return builder.fpext(builder.load(p, align=1), _vec("f32", 8))
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], _vec("i16", 8))
        h = builder.zext(builder.load(p, align=1), _vec("i32", 8))
        # f32 bits with the half's exponent unbiased by 112, then x 2^112 (also exact for subnormals);
        # exponent 31 (inf / nan) gets the f32 all-ones exponent instead.
        bits = builder.or_(builder.shl(builder.and_(h, _const("i32", 8, 0x7FFF)), _const("i32", 8, 13)),
                           builder.shl(builder.and_(h, _const("i32", 8, 0x8000)), _const("i32", 8, 16)))
        value = builder.fmul(builder.bitcast(bits, _vec("f32", 8)), _const("f32", 8, 2.0 ** 112))
        special = builder.icmp_unsigned("==", builder.and_(h, _const("i32", 8, 0x7C00)), _const("i32", 8, 0x7C00))
        inf_nan = builder.bitcast(builder.or_(bits, _const("i32", 8, 0x7F800000)), _vec("f32", 8))
        return builder.select(special, inf_nan, value)
    return F32x8(arr, index), codegen


@intrinsic
def add(typingctx, a, b):
    """Lane-wise a + b (integer wrap-around / IEEE float32)."""
    if not isinstance(a, Vector) or a != b:
        return None

    def codegen(context, builder, sig, args):
        if sig.args[0].kind == "f32":
            return builder.fadd(args[0], args[1])
        return builder.add(args[0], args[1])
    return a(a, b), codegen


def _is_f32_vector(v) -> bool:
    return isinstance(v, Vector) and v.kind == "f32"


@intrinsic
def mul(typingctx, a, b):
    """Lane-wise a * b of two float32 vectors of one width (IEEE, rounded: never fused with an add)."""
    if not (_is_f32_vector(a) and a == b):
        return None

    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], args[1])
    return a(a, b), codegen


@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c rounded once: lane-wise for float32 vectors of one width (llvm.fma.v8f32, ...), or
    float32 scalars (llvm.fma.f32)."""
    if _is_f32_vector(a) and a == b == c:
        result, llvm_type, name = a, _vec("f32", a.count), f"llvm.fma.v{a.count}f32"
    elif all(isinstance(x, types.Float) and x.bitwidth == 32 for x in (a, b, c)):
        result, llvm_type, name = types.float32, ir.FloatType(), "llvm.fma.f32"
    else:
        return None

    def codegen(context, builder, sig, args):
        fn_type = ir.FunctionType(llvm_type, [llvm_type] * 3)
        return builder.call(cgutils.get_or_insert_function(builder.module, fn_type, name), args)
    return result(a, b, c), codegen


@intrinsic
def add_exact_product(typingctx, a, b, c):
    """c + a * b lane-wise for float32 vectors of one width, where every a * b is exact in float32
    (e.g. two fp16 values): llvm.fmuladd, one vfmadd on FMA CPUs, a multiply then an add elsewhere;
    both round only the sum, so they agree bit for bit."""
    if not (_is_f32_vector(a) and a == b == c):
        return None

    def codegen(context, builder, sig, args):
        llvm_type = _vec("f32", a.count)
        fn_type = ir.FunctionType(llvm_type, [llvm_type] * 3)
        fn = cgutils.get_or_insert_function(builder.module, fn_type, f"llvm.fmuladd.v{a.count}f32")
        return builder.call(fn, args)
    return a(a, b, c), codegen


@intrinsic
def to_f32(typingctx, v):
    """I32x8 -> F32x8, I32x16 -> F32x16 (exact below 2^24)."""
    if not (isinstance(v, Vector) and v.kind == "i32"):
        return None

    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], _vec("f32", sig.args[0].count))
    return Vector("f32", v.count)(v), codegen


# float(i) for |i| < 2^22 without a conversion: the bits EXACT_BIAS + i are the float 1.5 * 2^23 + i
# exactly, and taking 1.5 * 2^23 off is exact. An integer dot started from EXACT_BIAS carries the
# bias for free; the subtraction issues on either vector port of an Intel core, where a 512-bit
# vcvtdq2ps shares port 0 with vpdpbusd (the two limit a many-token tile there).
EXACT_BIAS = 0x4B400000


@intrinsic
def unbias(typingctx, v):
    """I32xN holding EXACT_BIAS + i, |i| < 2^22 -> F32xN float(i), exact (to_f32 of i, bit for bit)."""
    if not (isinstance(v, Vector) and v.kind == "i32"):
        return None

    def codegen(context, builder, sig, args):
        floats = _vec("f32", sig.args[0].count)
        return builder.fsub(builder.bitcast(args[0], floats), ir.Constant(floats, [1.5 * 2.0 ** 23] * floats.count))
    return Vector("f32", v.count)(v), codegen


@intrinsic
def concat(typingctx, a, b):
    """Two vectors of one type side by side -> one of twice the lanes (a's lanes first)."""
    if not (isinstance(a, Vector) and a == b):
        return None

    def codegen(context, builder, sig, args):
        return builder.shuffle_vector(args[0], args[1], ir.Constant(ir.VectorType(_I32, 2 * a.count),
                                                                    list(range(2 * a.count))))
    return Vector(a.kind, 2 * a.count)(a, b), codegen


def _half(first: bool):
    @intrinsic
    def fn(typingctx, v):
        if not (isinstance(v, Vector) and v.count % 2 == 0):
            return None
        half = v.count // 2

        def codegen(context, builder, sig, args):
            lanes = list(range(half)) if first else list(range(half, 2 * half))
            return builder.shuffle_vector(args[0], args[0], ir.Constant(ir.VectorType(_I32, half), lanes))
        return Vector(v.kind, half)(v), codegen
    fn.__doc__ = f"The {'first' if first else 'second'} half of a vector's lanes (the inverse of concat)."
    return fn


@intrinsic
def each_twice(typingctx, v):
    """F32x8 (v0..v7) -> F32x16 (v0, v0, v1, v1, ..., v7, v7)."""
    if v != F32x8:
        return None

    def codegen(context, builder, sig, args):
        mask = ir.Constant(ir.VectorType(_I32, 16), [i // 2 for i in range(16)])
        return builder.shuffle_vector(args[0], args[0], mask)
    return Vector("f32", 16)(v), codegen


@intrinsic
def even_plus_odd(typingctx, v):
    """F32x16 -> F32x8, lane i = v[2i] + v[2i+1] (float32, rounded once)."""
    if v != Vector("f32", 16):
        return None

    def codegen(context, builder, sig, args):
        mask = ir.VectorType(_I32, 8)
        even = builder.shuffle_vector(args[0], args[0], ir.Constant(mask, list(range(0, 16, 2))))
        odd = builder.shuffle_vector(args[0], args[0], ir.Constant(mask, list(range(1, 16, 2))))
        return builder.fadd(even, odd)
    return F32x8(v), codegen


low_half = _half(True)
high_half = _half(False)


@intrinsic
def splat_f32(typingctx, x):
    """float32 scalar -> F32x8."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):
        value = context.cast(builder, args[0], sig.args[0], types.float32)
        return _splat(builder, value, _vec("f32", 8))
    return F32x8(x), codegen


@intrinsic
def splat_i32(typingctx, x):
    """integer scalar -> I32x8 (truncated to 32 bits)."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        value = context.cast(builder, args[0], sig.args[0], types.int32)
        return _splat(builder, value, _vec("i32", 8))
    return I32x8(x), codegen


@intrinsic
def zeros_i32x8(typingctx):
    def codegen(context, builder, sig, args):
        return _const("i32", 8, 0)
    return I32x8(), codegen


@intrinsic
def zeros_f32x8(typingctx):
    def codegen(context, builder, sig, args):
        return _const("f32", 8, 0.0)
    return F32x8(), codegen


def _prefetch_codegen(locality):
    """llvm.prefetch (a read, of data) of byte arr[index] with `locality` 0..3 (3: into L1, prefetcht0 on
    x86; 2: into L2, prefetcht1)."""
    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], ir.IntType(8))
        fn_type = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fn_type, "llvm.prefetch.p0")
        builder.call(fn, [p, ir.Constant(_I32, 0), ir.Constant(_I32, locality), ir.Constant(_I32, 1)])
        return context.get_dummy_value()
    return codegen


@intrinsic
def prefetch(typingctx, arr, index):
    """Hint: bring the cache line of byte arr[index] (contiguous 1-D byte array) into cache (L1)."""
    if not (_is_byte_row(arr) and isinstance(index, types.Integer)):
        return None
    return types.none(arr, index), _prefetch_codegen(3)


@intrinsic
def prefetch_to_l2(typingctx, arr, index):
    """Hint: bring the cache line of byte arr[index] (contiguous 1-D byte array) into L2, not L1."""
    if not (_is_byte_row(arr) and isinstance(index, types.Integer)):
        return None
    return types.none(arr, index), _prefetch_codegen(2)


@intrinsic
def load_f32x8(typingctx, arr, index):
    """arr[index:index+8] of a contiguous 1-D float32 array -> F32x8."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C" and arr.dtype == types.float32
            and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], _vec("f32", 8))
        return builder.load(p, align=4)
    return F32x8(arr, index), codegen


@intrinsic
def store_f32x8(typingctx, arr, index, v):
    """arr[index:index+8] = v for a contiguous 1-D float32 array."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C" and arr.dtype == types.float32
            and isinstance(index, types.Integer) and v == F32x8):
        return None

    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], _vec("f32", 8))
        builder.store(args[2], p, align=4)
        return context.get_dummy_value()
    return types.none(arr, index, v), codegen
