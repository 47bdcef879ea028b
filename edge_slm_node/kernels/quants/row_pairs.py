"""One packed row group (8 rows) or a pair of them (16 rows) behind the same calls, so that one
kernel body compiles to 8-lane code for a group and to 16-lane (AVX-512) code for a pair.

`rows` is a packed group (1-D bytes) or a tuple of two; `dest` is (out, col), or (out0, col0,
out1, col1) for a pair whose groups may land in different outputs (fused matrices). Every lane
of the 16-lane code does what the same row's lane does in the 8-lane code, so the two are
bit-equal. Activation-side vectors (broadcasts, splats) are made 8 lanes wide and widened with
`like_rows`.
"""
from numba import types
from numba.extending import overload

from ..simd import concat, high_half, load_f32x8, load_halves_as_f32, low_half, prefetch_to_l2, store_f32x8
from ..simd_int import load_i8x8_as_i32, load_i8x32
from ..vec8 import sub
from .kquants import scale_min_rows
from .lanes import L2_PREFETCH_BYTES, PREFETCH_WEIGHTS, prefetch_streamed_lines


def _is_pair(rows) -> bool:
    return isinstance(rows, types.BaseTuple)


def rows_chunk(rows, at):
    """The 32-byte chunk at byte `at` of each group -> I8x32, or I8x64 for a pair."""


def rows_halves(rows, at):
    """The 8 fp16 at byte `at` of each group -> F32x8, or F32x16 for a pair."""


def rows_i8x8_as_i32(rows, at):
    """The 8 signed bytes at byte `at` of each group -> I32x8, or I32x16 for a pair."""


def rows_scale_min(rows, at, s):
    """kquants.scale_min_rows of each group -> (scale, min), I32x8 or I32x16 each."""


def prefetch_tile_rows(rows, at, lines):
    """lanes.prefetch_streamed_lines for a 4-token tile over a group or a pair of groups, reading byte
    `at` of each now. A pair's L2 prefetch is L2_PREFETCH_BYTES ahead in the weights the tile
    streams: half that in each group's own stream, which goes on past the group's end in the group
    two further (a pair of adjacent groups is followed by the next pair)."""


def like_rows(v, rows):
    """An 8-lane vector as wide as rows' vectors: itself, or twice side by side for a pair."""


def load_like_rows(arr, at, rows):
    """float32 arr[at:at+8] as an F32x8, or arr[at:at+16] as an F32x16 for a pair (accumulators in memory)."""


def store_like_rows(arr, at, v, rows):
    """arr[at:at+8] = v (F32x8), or arr[at:at+16] = v (F32x16) for a pair."""


def store_rows(dest, t, a):
    """out[t, col:col+8] = a for each group's (out, col) in dest, its lanes of a."""


def store_difference(dest, t, a, m):
    """out[t, col:col+8] = a - m for each group's (out, col) in dest, its lanes of a and m."""


@overload(rows_chunk, inline="always")
def _rows_chunk(rows, at):
    if _is_pair(rows):
        return lambda rows, at: concat(load_i8x32(rows[0], at), load_i8x32(rows[1], at))
    return lambda rows, at: load_i8x32(rows, at)


@overload(rows_halves, inline="always")
def _rows_halves(rows, at):
    if _is_pair(rows):
        return lambda rows, at: concat(load_halves_as_f32(rows[0], at), load_halves_as_f32(rows[1], at))
    return lambda rows, at: load_halves_as_f32(rows, at)


@overload(rows_i8x8_as_i32, inline="always")
def _rows_i8x8_as_i32(rows, at):
    if _is_pair(rows):
        return lambda rows, at: concat(load_i8x8_as_i32(rows[0], at), load_i8x8_as_i32(rows[1], at))
    return lambda rows, at: load_i8x8_as_i32(rows, at)


@overload(rows_scale_min)
def _rows_scale_min(rows, at, s):
    if _is_pair(rows):
        def pair(rows, at, s):
            scale0, min0 = scale_min_rows(rows[0], at, s)
            scale1, min1 = scale_min_rows(rows[1], at, s)
            return concat(scale0, scale1), concat(min0, min1)
        return pair
    return lambda rows, at, s: scale_min_rows(rows, at, s)


@overload(prefetch_tile_rows, inline="always")
def _prefetch_tile_rows(rows, at, lines):
    if _is_pair(rows):
        def pair(rows, at, lines):
            if PREFETCH_WEIGHTS:
                prefetch_streamed_lines(rows[0], at, lines)
                prefetch_streamed_lines(rows[1], at, lines)
                return
            size = rows[0].shape[0]               # rows[1] starts where rows[0] ends (packed groups i, i + 1)
            groups_on, offset = divmod(at + L2_PREFETCH_BYTES // 2, size)
            first = 2 * groups_on * size + offset
            for i in range(lines):
                prefetch_to_l2(rows[0], first + 64 * i)
                prefetch_to_l2(rows[0], first + size + 64 * i)
        return pair
    return lambda rows, at, lines: prefetch_streamed_lines(rows, at, lines)


@overload(like_rows, inline="always")
def _like_rows(v, rows):
    if _is_pair(rows):
        return lambda v, rows: concat(v, v)
    return lambda v, rows: v


@overload(store_difference, inline="always")
def _store_difference(dest, t, a, m):
    if len(dest.types) == 4:
        def pair(dest, t, a, m):
            store_f32x8(dest[0][t], dest[1], sub(low_half(a), low_half(m)))
            store_f32x8(dest[2][t], dest[3], sub(high_half(a), high_half(m)))
        return pair
    return lambda dest, t, a, m: store_f32x8(dest[0][t], dest[1], sub(a, m))


@overload(store_rows, inline="always")
def _store_rows(dest, t, a):
    if len(dest.types) == 4:
        def pair(dest, t, a):
            store_f32x8(dest[0][t], dest[1], low_half(a))
            store_f32x8(dest[2][t], dest[3], high_half(a))
        return pair
    return lambda dest, t, a: store_f32x8(dest[0][t], dest[1], a)


@overload(load_like_rows, inline="always")
def _load_like_rows(arr, at, rows):
    if _is_pair(rows):
        return lambda arr, at, rows: concat(load_f32x8(arr, at), load_f32x8(arr, at + 8))
    return lambda arr, at, rows: load_f32x8(arr, at)


@overload(store_like_rows, inline="always")
def _store_like_rows(arr, at, v, rows):
    if _is_pair(rows):
        def pair(arr, at, v, rows):
            store_f32x8(arr, at, low_half(v))
            store_f32x8(arr, at + 8, high_half(v))
        return pair
    return lambda arr, at, v, rows: store_f32x8(arr, at, v)
