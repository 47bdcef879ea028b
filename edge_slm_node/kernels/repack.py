"""Row-interleaved weight layouts for the quantized matmuls, and the SIMD primitives reading them.

Rows are repacked at load time in groups of ROWS_PER_GROUP = 8 so that one 32-byte load holds
the same weights of 8 rows and a block's integer dot products land in one vector of 8 int32
(one lane per row): no horizontal sums, no per-block scale inside the inner loop. Every
byte of the GGUF blocks is kept (scales stay fp16), so the packed form is exactly as large
as the stored one. Layout of group g (rows 8g..8g+7), one entry per 32-weight block b:

  Q4_1  160 B: d[8] f16 | m[8] f16 | 4 chunks c of 32 B: row r's GGUF nibble bytes 4c..4c+3
  Q4_0  144 B: d[8] f16 |            4 chunks as Q4_1
  Q8_0  272 B: d[8] f16 | 16 chunks c of 16 B: row r's int8 weights 2c, 2c+1

(chunk bytes are ordered row-major: row 0's bytes, then row 1's, ...). A nibble byte holds
weight j in its low and weight j+16 in its high nibble, as in GGUF. Rows after the last full
group ("tail", rows % 8 of them) stay in GGUF layout and are handled by scalar code.

The primitives are numba intrinsics over LLVM vector types. On x86 with AVX2 they use
pmaddubsw / pmaddwd / vcvtph2ps; elsewhere the same semantics are emitted as generic LLVM
vector code (slower, still exact). All integer sums are exact for the value ranges used:
nibble (0..15) x int8 pairs <= 2*15*128 in int16, int8 x int8 pairs in int32.
Note: numba's cache does not notice edits to this file; clear __pycache__ after changing it.
"""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from ..model.quant import Q4_0, Q4_1, Q8_0, QuantType

ROWS_PER_GROUP = 8
_HALF_BYTES = 2 * ROWS_PER_GROUP                      # d (or m) of the 8 rows of a block
GROUP_BLOCK_BYTES = {Q4_1.name: 160, Q4_0.name: 144, Q8_0.name: 272}


# ----------------------------------------------------------------------------------- repacking

def split_rows(raw: np.ndarray) -> tuple[int, int]:
    """(rows, bytes_per_row) -> (number of full groups, number of tail rows)."""
    return raw.shape[0] // ROWS_PER_GROUP, raw.shape[0] % ROWS_PER_GROUP


_LAYOUT = {Q4_1.name: (4, 4), Q4_0.name: (2, 4), Q8_0.name: (2, 2)}   # (scale bytes, chunk bytes) per row


def repack(raw: np.ndarray, quant: QuantType) -> tuple[np.ndarray, np.ndarray]:
    """GGUF bytes (rows, nb*type_size) -> packed (groups, nb*group_block_bytes) u8, tail (rows%8, nb*type_size) u8."""
    if quant.name not in _LAYOUT:
        raise ValueError(f"no packed layout for {quant.name}")
    blocks = raw.shape[1] // quant.type_size
    groups, _ = split_rows(raw)
    packed = np.empty((groups, blocks * GROUP_BLOCK_BYTES[quant.name]), np.uint8)
    scale_bytes, chunk_bytes = _LAYOUT[quant.name]
    _pack(raw, packed, quant.type_size, scale_bytes, chunk_bytes)
    tail = np.array(raw[groups * ROWS_PER_GROUP:], dtype=np.uint8, order="C")
    return packed, tail


@njit(cache=True)
def _pack(raw, packed, type_size, scale_bytes, chunk_bytes):
    """Fill packed (groups, nb*8*type_size) from raw's first groups*8 rows; see the layout above."""
    rows = ROWS_PER_GROUP
    payload_start = scale_bytes // 2 * _HALF_BYTES
    for g in range(packed.shape[0]):
        for r in range(rows):
            source = raw[g * rows + r]
            for b in range(raw.shape[1] // type_size):
                src = b * type_size
                dst = b * rows * type_size
                for s in range(scale_bytes // 2):
                    packed[g, dst + s * _HALF_BYTES + 2 * r] = source[src + 2 * s]
                    packed[g, dst + s * _HALF_BYTES + 2 * r + 1] = source[src + 2 * s + 1]
                for c in range((type_size - scale_bytes) // chunk_bytes):
                    at = dst + payload_start + c * rows * chunk_bytes + r * chunk_bytes
                    for k in range(chunk_bytes):
                        packed[g, at + k] = source[src + scale_bytes + c * chunk_bytes + k]


def unpack(packed: np.ndarray, tail: np.ndarray, quant: QuantType) -> np.ndarray:
    """Inverse of repack (for tests): -> GGUF bytes (rows, nb*type_size)."""
    groups, rows = packed.shape[0], ROWS_PER_GROUP
    block_bytes = GROUP_BLOCK_BYTES[quant.name]
    blocks = packed.shape[1] // block_bytes
    scale_bytes = (2 if quant is Q4_1 else 1) * _HALF_BYTES
    chunk_bytes = 2 if quant is Q8_0 else 4
    p = packed.reshape(groups, blocks, block_bytes)
    head = p[..., :scale_bytes].reshape(groups, blocks, scale_bytes // _HALF_BYTES, rows, 2).transpose(0, 1, 3, 2, 4)
    payload = p[..., scale_bytes:].reshape(groups, blocks, (block_bytes - scale_bytes) // (rows * chunk_bytes), rows,
                                           chunk_bytes).transpose(0, 1, 3, 2, 4)
    block = np.concatenate([head.reshape(groups, blocks, rows, scale_bytes // rows),
                            payload.reshape(groups, blocks, rows, (block_bytes - scale_bytes) // rows)], axis=3)
    out = block.transpose(0, 2, 1, 3).reshape(groups * rows, blocks * quant.type_size)
    return np.concatenate([out, tail], axis=0)


# ---------------------------------------------------------------------- vector types (numba)

class Vector(types.Type):
    """An LLVM vector value held in registers, e.g. Vector('i16', 16)."""

    def __init__(self, kind: str, count: int):
        self.kind = kind
        self.count = count
        super().__init__(name=f"Vector({kind}x{count})")


_ELEMENT = {"i8": ir.IntType(8), "i16": ir.IntType(16), "i32": ir.IntType(32), "f32": ir.FloatType()}


@register_model(Vector)
class _VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(_ELEMENT[fe_type.kind], fe_type.count))


I8x32 = Vector("i8", 32)
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


# ------------------------------------------------------------------------- SIMD primitives

@intrinsic
def load_i8x32(typingctx, arr, index):
    """arr[index:index+32] of a contiguous 1-D byte array -> I8x32."""
    if not (_is_byte_row(arr) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], _vec("i8", 32))
        return builder.load(p, align=1)
    return I8x32(arr, index), codegen


@intrinsic
def broadcast_i8x4(typingctx, arr, index):
    """arr[index:index+4] repeated 8 times -> I8x32."""
    if not (_is_byte_row(arr) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        word = builder.load(_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], _I32), align=1)
        return builder.bitcast(_splat(builder, word, _vec("i32", 8)), _vec("i8", 32))
    return I8x32(arr, index), codegen


@intrinsic
def low_nibbles(typingctx, v):
    """byte & 15 for each of the 32 bytes."""
    if v != I8x32:
        return None

    def codegen(context, builder, sig, args):
        return builder.and_(args[0], _const("i8", 32, 15))
    return I8x32(v), codegen


@intrinsic
def high_nibbles(typingctx, v):
    """byte >> 4 (unsigned) for each of the 32 bytes."""
    if v != I8x32:
        return None

    def codegen(context, builder, sig, args):
        return builder.lshr(args[0], _const("i8", 32, 4))
    return I8x32(v), codegen


@intrinsic
def dot_pairs_u8_i8(typingctx, unsigned, signed):
    """u (unsigned bytes) * s (signed bytes), adjacent products summed -> I16x16.

    Exact while |u0*s0 + u1*s1| <= 32767 (pmaddubsw saturates beyond)."""
    if unsigned != I8x32 or signed != I8x32:
        return None

    def codegen(context, builder, sig, args):
        if _has_features(context, "avx2"):
            return _x86_call(builder, "llvm.x86.avx2.pmadd.ub.sw", _vec("i16", 16), args)
        wide = _vec("i16", 32)
        products = builder.mul(builder.zext(args[0], wide), builder.sext(args[1], wide))
        return _pair_sums(builder, products, 16)
    return I16x16(unsigned, signed), codegen


@intrinsic
def add_pairs_i16(typingctx, v):
    """I16x16 -> I32x8, lane i = v[2i] + v[2i+1] (exact)."""
    if v != I16x16:
        return None

    def codegen(context, builder, sig, args):
        if _has_features(context, "avx2"):
            return _x86_call(builder, "llvm.x86.avx2.pmadd.wd", _vec("i32", 8), [args[0], _const("i16", 16, 1)])
        return _pair_sums(builder, builder.sext(args[0], _vec("i32", 16)), 8)
    return I32x8(v), codegen


@intrinsic
def dot_pairs_i16(typingctx, a, b):
    """I16x16 * I16x16, adjacent products summed -> I32x8 (exact)."""
    if a != I16x16 or b != I16x16:
        return None

    def codegen(context, builder, sig, args):
        if _has_features(context, "avx2"):
            return _x86_call(builder, "llvm.x86.avx2.pmadd.wd", _vec("i32", 8), args)
        wide = _vec("i32", 16)
        products = builder.mul(builder.sext(args[0], wide), builder.sext(args[1], wide))
        return _pair_sums(builder, products, 8)
    return I32x8(a, b), codegen


@intrinsic
def load_i8x16_as_i16(typingctx, arr, index):
    """arr[index:index+16] signed bytes -> I16x16 (sign-extended)."""
    if not (_is_byte_row(arr) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], _vec("i8", 16))
        return builder.sext(builder.load(p, align=1), _vec("i16", 16))
    return I16x16(arr, index), codegen


@intrinsic
def broadcast_i16x2(typingctx, arr, index):
    """int16 arr[index], arr[index+1] repeated 8 times -> I16x16."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C" and arr.dtype == types.int16
            and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        word = builder.load(_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], _I32), align=2)
        return builder.bitcast(_splat(builder, word, _vec("i32", 8)), _vec("i16", 16))
    return I16x16(arr, index), codegen


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


@intrinsic
def mul(typingctx, a, b):
    """Lane-wise a * b (float32, IEEE, never fused with an add)."""
    if a != F32x8 or b != F32x8:
        return None

    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], args[1])
    return F32x8(a, b), codegen


@intrinsic
def to_f32(typingctx, v):
    """I32x8 -> F32x8 (exact below 2^24)."""
    if v != I32x8:
        return None

    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], _vec("f32", 8))
    return F32x8(v), codegen


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


@intrinsic
def prefetch(typingctx, arr, index):
    """Hint: bring the cache line of byte arr[index] (contiguous 1-D byte array) into cache."""
    if not (_is_byte_row(arr) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], ir.IntType(8))
        fn_type = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fn_type, "llvm.prefetch.p0")
        builder.call(fn, [p, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
        return context.get_dummy_value()
    return types.none(arr, index), codegen


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
