"""Integer SIMD primitives of the quantized dot products: byte loads and broadcasts, nibbles,
bit fields, pairwise multiply-adds (pmaddubsw / pmaddwd on AVX2) and 4-byte dot products
(vpdpbusd with VNNI), the same semantics as generic LLVM vector code elsewhere. All sums are
exact for the value ranges used: unsigned weights (4-, 5-, 6-bit: <= 63) x int8 pairs <= 2*63*128
in int16, int8 x int8 pairs and every 4-byte dot in int32.
Note: numba's cache does not notice edits to this file; setup.sh clears it when kernels/ changes.
"""
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .simd import (I8x32, I8x64, I16x16, I32x8, Vector, _I32, _const, _has_features, _is_byte_row, _pair_sums, _pointer,
                   _splat, _vec, _x86_call)


def _byte_load(count: int):
    vector = Vector("i8", count)

    @intrinsic
    def fn(typingctx, arr, index):
        if not (_is_byte_row(arr) and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], _vec("i8", count))
            return builder.load(p, align=1)
        return vector(arr, index), codegen
    fn.__doc__ = f"arr[index:index+{count}] of a contiguous 1-D byte array -> I8x{count}."
    return fn


load_i8x32 = _byte_load(32)
load_i8x64 = _byte_load(64)


def _is_int32_row(arr) -> bool:
    return isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C" and arr.dtype == types.int32


_ELEMENT_BITS = {"i8": 8, "i16": 16, "i32": 32}


def _repeated_word(bits: int, result: Vector, accepts, doc: str):
    """An intrinsic (arr, index) -> the `bits`-bit word at arr[index] repeated to fill `result`."""
    copies = result.count * _ELEMENT_BITS[result.kind] // bits

    @intrinsic
    def fn(typingctx, arr, index):
        if not (accepts(arr) and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], ir.IntType(bits))
            word = builder.load(p, align=1)
            return builder.bitcast(_splat(builder, word, _vec(f"i{bits}", copies)), _vec(result.kind, result.count))
        return result(arr, index), codegen
    fn.__doc__ = doc
    return fn


broadcast_i8x4 = _repeated_word(32, I8x32, _is_byte_row, "arr[index:index+4] repeated 8 times -> I8x32.")
broadcast_i8x8 = _repeated_word(64, I8x64, _is_byte_row,
                                "arr[index:index+8] repeated 8 times -> I8x64 (its two 4-byte words alternating).")
broadcast_i32x2 = _repeated_word(64, Vector("i32", 16), _is_int32_row,
                                 "arr[index], arr[index+1] of a contiguous 1-D int32 array repeated 8 times -> I32x16.")


@intrinsic
def spread_word_pair(typingctx, arr, index):
    """arr[index:index+4] repeated 8 times, then arr[index+4:index+8] repeated 8 times -> I8x64:
    the activations of two consecutive 32-byte chunks of 8 rows' 4-byte words, loaded as one vector."""
    if not (_is_byte_row(arr) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], _vec("i32", 2))
        words = builder.load(p, align=1)
        mask = ir.Constant(ir.VectorType(_I32, 16), [i // 8 for i in range(16)])
        return builder.bitcast(builder.shuffle_vector(words, words, mask), _vec("i8", 64))
    return I8x64(arr, index), codegen


@intrinsic
def interleave_words(typingctx, a, b):
    """Two I8x32 -> I8x64 of their 4-byte words alternating: word 2i is a's word i, 2i+1 b's."""
    if not (a == b == I8x32):
        return None

    def codegen(context, builder, sig, args):
        words = [builder.bitcast(v, _vec("i32", 8)) for v in args]
        mask = ir.Constant(ir.VectorType(_I32, 16), [i // 2 + 8 * (i % 2) for i in range(16)])
        return builder.bitcast(builder.shuffle_vector(words[0], words[1], mask), _vec("i8", 64))
    return I8x64(a, b), codegen


@intrinsic
def low_nibbles(typingctx, v):
    """byte & 15 for each byte of an I8x32 or I8x64."""
    if not (isinstance(v, Vector) and v.kind == "i8"):
        return None

    def codegen(context, builder, sig, args):
        return builder.and_(args[0], _const("i8", sig.args[0].count, 15))
    return v(v), codegen


@intrinsic
def high_nibbles(typingctx, v):
    """byte >> 4 (unsigned) for each byte of an I8x32 or I8x64 (_byte_shift)."""
    if not (isinstance(v, Vector) and v.kind == "i8"):
        return None

    def codegen(context, builder, sig, args):
        return _byte_shift(builder, "lshr", args[0], _const("i8", sig.args[0].count, 4))
    return v(v), codegen


def _byte_shift(builder, op, v, counts):
    """Every byte of an i8 vector shifted ("shl" or "lshr") by counts (an i8 vector of one value,
    0..7), as a shift of 16-bit words and a mask of the bits that crossed from the neighbouring byte:
    LLVM lowers a byte shift to vgf2p8affineqb on CPUs with GFNI, which on Zen 4 takes the
    pipe of vpdpbusd, while word shifts and masks run beside it."""
    count = v.type.count
    words = builder.bitcast(v, _vec("i16", count // 2))
    word_counts = builder.zext(builder.extract_element(counts, ir.Constant(_I32, 0)), ir.IntType(16))
    shifted = getattr(builder, op)(words, _splat(builder, word_counts, _vec("i16", count // 2)))
    kept = getattr(builder, op)(_const("i8", count, 0xFF), counts)
    return builder.and_(builder.bitcast(shifted, _vec("i8", count)), kept)


@intrinsic
def dot_pairs_u8_i8(typingctx, unsigned, signed):
    """u (unsigned bytes) * s (signed bytes), adjacent products summed: I8x32 -> I16x16, I8x64 ->
    I16x32. Exact while |u0*s0 + u1*s1| <= 32767 (pmaddubsw saturates beyond)."""
    if not (isinstance(unsigned, Vector) and unsigned.kind == "i8" and unsigned.count in (32, 64)
            and unsigned == signed):
        return None
    pairs = unsigned.count // 2

    def codegen(context, builder, sig, args):
        if pairs == 16 and _has_features(context, "avx2"):
            return _x86_call(builder, "llvm.x86.avx2.pmadd.ub.sw", _vec("i16", 16), args)
        if pairs == 32 and _has_features(context, "avx512bw"):
            return _x86_call(builder, "llvm.x86.avx512.pmaddubs.w.512", _vec("i16", 32), args)
        wide = _vec("i16", 2 * pairs)
        products = builder.mul(builder.zext(args[0], wide), builder.sext(args[1], wide))
        return _pair_sums(builder, products, pairs)
    return Vector("i16", pairs)(unsigned, signed), codegen


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
    """I16x16 * I16x16 (or I16x32 * I16x32), adjacent products summed -> I32x8 (I32x16), exact."""
    if not (isinstance(a, Vector) and a.kind == "i16" and a.count in (16, 32) and a == b):
        return None
    lanes = a.count // 2

    def codegen(context, builder, sig, args):
        if lanes == 8 and _has_features(context, "avx2"):
            return _x86_call(builder, "llvm.x86.avx2.pmadd.wd", _vec("i32", 8), args)
        if lanes == 16 and _has_features(context, "avx512bw"):
            return _x86_call(builder, "llvm.x86.avx512.pmaddw.d.512", _vec("i32", 16), args)
        wide = _vec("i32", 2 * lanes)
        products = builder.mul(builder.sext(args[0], wide), builder.sext(args[1], wide))
        return _pair_sums(builder, products, lanes)
    return Vector("i32", lanes)(a, b), codegen


@intrinsic
def dot_halves_i16(typingctx, a, b):
    """I32xN lanes each holding two int16 (low half, high half): per lane a.low * b.low + a.high *
    b.high -> I32xN, N = 8 or 16 (pmaddwd; exact unless both pairs are -32768)."""
    if not (isinstance(a, Vector) and a.kind == "i32" and a.count in (8, 16) and a == b):
        return None

    def codegen(context, builder, sig, args):
        return _halves_products(context, builder, *args)
    return a(a, b), codegen


def _halves_products(context, builder, a, b):
    """dot_halves_i16's IR: pmaddwd of I32xN operands read as int16 pairs."""
    lanes = a.type.count
    halves = [builder.bitcast(arg, _vec("i16", 2 * lanes)) for arg in (a, b)]
    if lanes == 8 and _has_features(context, "avx2"):
        return _x86_call(builder, "llvm.x86.avx2.pmadd.wd", _vec("i32", 8), halves)
    if lanes == 16 and _has_features(context, "avx512bw"):
        return _x86_call(builder, "llvm.x86.avx512.pmaddw.d.512", _vec("i32", 16), halves)
    wide = _vec("i32", 2 * lanes)
    products = builder.mul(builder.sext(halves[0], wide), builder.sext(halves[1], wide))
    return _pair_sums(builder, products, lanes)


@intrinsic
def dot_halves_acc(typingctx, acc, a, b):
    """acc + dot_halves_i16(a, b) (I32x8 or I32x16): one vpdpwssd where the CPU has VNNI of that width,
    kept where it is written (LLVM turns a tree of adds of pmaddwd results into one serial vpdpwssd chain)."""
    if not (isinstance(acc, Vector) and acc.kind == "i32" and acc.count in (8, 16) and acc == a == b):
        return None

    def codegen(context, builder, sig, args):
        lanes = sig.args[0].count
        if _has_vnni(context, lanes):
            return _x86_call(builder, f"llvm.x86.avx512.vpdpwssd.{32 * lanes}", _vec("i32", lanes), list(args))
        return builder.add(args[0], _halves_products(context, builder, args[1], args[2]))
    return acc(acc, a, b), codegen


# ------------------------------------------- bit fields of the 5- and 6-bit and K-quant types

def _is_int_vector(v) -> bool:
    return isinstance(v, Vector) and v.kind in ("i8", "i16", "i32")


def _splat_int(context, builder, value, value_type, vector):
    """An integer scalar (any width) splatted to the element type of Vector `vector`."""
    element = _vec(vector.kind, vector.count).element
    scalar = context.cast(builder, value, value_type, types.int64)
    scalar = builder.trunc(scalar, element) if element.width < 64 else scalar
    return _splat(builder, scalar, _vec(vector.kind, vector.count))


def _bitwise(op, doc):
    @intrinsic
    def fn(typingctx, a, b):
        if not (_is_int_vector(a) and a == b):
            return None

        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1])
        return a(a, b), codegen
    fn.__doc__ = doc
    return fn


bits_and = _bitwise("and_", "Lane-wise a & b of two integer vectors of one type.")
bits_or = _bitwise("or_", "Lane-wise a | b of two integer vectors of one type.")
sub_int = _bitwise("sub", "Lane-wise a - b of two integer vectors of one type (wrap-around).")
mul_i32 = _bitwise("mul", "Lane-wise a * b of two integer vectors of one type (low bits; vpmulld for I32x8).")


def _by_scalar(op, doc):
    @intrinsic
    def fn(typingctx, v, n):
        if not (_is_int_vector(v) and isinstance(n, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            scalars = _splat_int(context, builder, args[1], sig.args[1], sig.args[0])
            if op in ("shl", "lshr") and sig.args[0].kind == "i8":
                return _byte_shift(builder, op, args[0], scalars)
            return getattr(builder, op)(args[0], scalars)
        return v(v, n), codegen
    fn.__doc__ = doc
    return fn


mask_bits = _by_scalar("and_", "v & n, n splatted to every lane.")
toggle_bits = _by_scalar("xor", "v ^ n, n splatted to every lane.")
shift_right = _by_scalar("lshr", "v >> n (logical: zeros shifted in), every lane by the same count (bytes: 0..7).")
shift_left = _by_scalar("shl", "v << n, every lane by the same count (bytes: 0..7).")


@intrinsic
def join_halves(typingctx, low, high):
    """I32x8 or I32x16 -> per lane (low & 0xFFFF) | (high << 16): the low int16 of a lane of `low`
    and of `high` as one lane's two halves (dot_halves_i16's operand). 16 lanes with AVX-512: by
    vpslld and vpternlogd, since LLVM folds shift, mask and or into one vpermt2w, which on Zen 4
    competes with vpdpbusd for its pipe."""
    if not (isinstance(low, Vector) and low.kind == "i32" and low.count in (8, 16) and low == high):
        return None

    def codegen(context, builder, sig, args):
        lanes = sig.args[0].count
        if lanes == 16 and _has_features(context, "avx512f"):
            shifted = _x86_call(builder, "llvm.x86.avx512.pslli.d.512", _vec("i32", 16),
                                [args[1], ir.Constant(_I32, 16)])
            # vpternlogd imm 0xF8: a | (b & c) of its operands (a, b, c), here shifted | (low & 0xFFFF)
            return _x86_call(builder, "llvm.x86.avx512.pternlog.d.512", _vec("i32", 16),
                             [shifted, args[0], _const("i32", 16, 0xFFFF), ir.Constant(_I32, 0xF8)])
        return builder.or_(builder.and_(args[0], _const("i32", lanes, 0xFFFF)),
                           builder.shl(args[1], _const("i32", lanes, 16)))
    return low(low, high), codegen


def _load_8_bytes(signed: bool, doc: str):
    @intrinsic
    def fn(typingctx, arr, index):
        if not (_is_byte_row(arr) and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            p = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], _vec("i8", 8))
            raw = builder.load(p, align=1)
            return (builder.sext if signed else builder.zext)(raw, _vec("i32", 8))
        return I32x8(arr, index), codegen
    fn.__doc__ = doc
    return fn


load_u8x8_as_i32 = _load_8_bytes(False, "arr[index:index+8] unsigned bytes -> I32x8 (zero-extended).")
load_i8x8_as_i32 = _load_8_bytes(True, "arr[index:index+8] signed bytes -> I32x8 (sign-extended).")


@intrinsic
def i16_pairs(typingctx, v):
    """I32x8 (I32x16), values within int16 -> I16x16 (I16x32) with lane i's value in elements 2i
    and 2i+1: the per-row multiplier of dot_pairs_i16 for 8 (16) rows' pair sums."""
    if not (isinstance(v, Vector) and v.kind == "i32" and v.count in (8, 16)):
        return None
    lanes = v.count

    def codegen(context, builder, sig, args):
        narrow = builder.trunc(args[0], _vec("i16", lanes))
        mask = ir.Constant(ir.VectorType(_I32, 2 * lanes), [i // 2 for i in range(2 * lanes)])
        return builder.shuffle_vector(narrow, narrow, mask)
    return Vector("i16", 2 * lanes)(v), codegen


@intrinsic
def broadcast_i32(typingctx, arr, index):
    """The int32 or int16 arr[index] (1-D array) sign-extended and repeated 8 times -> I32x8."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype in (types.int16, types.int32)
            and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        element = ir.IntType(sig.args[0].dtype.bitwidth)
        value = builder.load(_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1], element))
        if element.width < 32:
            value = builder.sext(value, _I32)
        return _splat(builder, value, _vec("i32", 8))
    return I32x8(arr, index), codegen


shift_right_signed = _by_scalar("ashr", "v >> n (arithmetic: the sign shifted in), every lane by the same count.")


def _dot4_fallback(builder, acc, unsigned, signed):
    """acc + the 4-byte sums of unsigned * signed through pmaddubsw / pmaddwd semantics (exact
    while a pair of products stays within int16)."""
    lanes = acc.type.count
    products = builder.mul(builder.zext(unsigned, _vec("i16", 4 * lanes)), builder.sext(signed, _vec("i16", 4 * lanes)))
    pairs = _pair_sums(builder, products, 2 * lanes)
    return builder.add(acc, _pair_sums(builder, builder.sext(pairs, _vec("i32", 2 * lanes)), lanes))


def _has_vnni(context, lanes: int) -> bool:
    """vpdpbusd of this width is available: 8 lanes with AVX-VNNI or AVX512-VNNI, 16 with AVX512-VNNI."""
    if lanes == 16:
        return _has_features(context, "avx512vnni", "avx512bw")
    return _has_features(context, "avxvnni") or _has_features(context, "avx512vnni", "avx512vl")


def _vnni(context, builder, acc, unsigned, signed):
    i32xn = acc.type
    return _x86_call(builder, f"llvm.x86.avx512.vpdpbusd.{32 * i32xn.count}", i32xn,
                     [acc, builder.bitcast(unsigned, i32xn), builder.bitcast(signed, i32xn)])


def _is_dot4(acc, unsigned, signed) -> bool:
    """(I32xN, I8x4N, I8x4N) for N = 8 or 16."""
    return (isinstance(acc, Vector) and acc.kind == "i32" and acc.count in (8, 16)
            and unsigned == signed == Vector("i8", 4 * acc.count))


@intrinsic
def dot4_acc(typingctx, acc, unsigned, signed):
    """acc (I32x8 or I32x16) + per lane the sum of 4 products of unsigned bytes (<= 127) and signed
    bytes: vpdpbusd where the CPU has it at this width, else pmaddubsw + pmaddwd (exact)."""
    if not _is_dot4(acc, unsigned, signed):
        return None

    def codegen(context, builder, sig, args):
        if _has_vnni(context, sig.args[0].count):
            return _vnni(context, builder, *args)
        return _dot4_fallback(builder, *args)
    return acc(acc, unsigned, signed), codegen


@intrinsic
def dot4_any_u8_acc(typingctx, acc, unsigned, signed):
    """dot4_acc for unsigned bytes of the whole range 0..255: the same vpdpbusd with VNNI, else
    products widened to int32 before they are summed (pmaddubsw would saturate)."""
    if not _is_dot4(acc, unsigned, signed):
        return None

    def codegen(context, builder, sig, args):
        lanes = sig.args[0].count
        if _has_vnni(context, lanes):
            return _vnni(context, builder, *args)
        wide = _vec("i32", 4 * lanes)
        products = builder.mul(builder.zext(args[1], wide), builder.sext(args[2], wide))
        return builder.add(args[0], _pair_sums(builder, _pair_sums(builder, products, 2 * lanes), lanes))
    return acc(acc, unsigned, signed), codegen


@intrinsic
def dot4_high_nibbles_acc(typingctx, acc, q, signed):
    """acc (I32x8 or I32x16) + 16 * per lane the sum of 4 products of the high nibbles of q and
    signed bytes: vpdpbusd on q & 0xF0 with VNNI (no shift needed), else (q >> 4) through
    pmaddubsw, times 16."""
    if not _is_dot4(acc, q, signed):
        return None

    def codegen(context, builder, sig, args):
        lanes = sig.args[0].count
        if _has_vnni(context, lanes):
            return _vnni(context, builder, args[0], builder.and_(args[1], _const("i8", 4 * lanes, 0xF0)), args[2])
        sums = _dot4_fallback(builder, _const("i32", lanes, 0), builder.lshr(args[1], _const("i8", 4 * lanes, 4)),
                              args[2])
        return builder.add(args[0], builder.shl(sums, _const("i32", lanes, 4)))
    return acc(acc, q, signed), codegen


@intrinsic
def wide_dot4_available(typingctx):
    """True when this compilation has 16-lane vpdpbusd (AVX512-VNNI): the K-quant prompt kernels
    then run two row groups at once."""
    def codegen(context, builder, sig, args):
        return ir.Constant(ir.IntType(1), int(_has_vnni(context, 16)))
    return types.boolean(), codegen
