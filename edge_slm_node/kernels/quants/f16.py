"""F16 weights (2-byte halves, kept in the file mapping): x is rounded to fp16 first, as
llama.cpp converts activations for an F16 matmul; products and sums in float32."""
import numpy as np
from numba import njit, prange

from ..half import half_to_float, round_to_half
from .common import MATMUL_SIGNATURE, PARALLEL_MIN_MACS, rows_of, team_share

FUSABLE = False          # writes outs[0] only: q|k|v and gate|up run as separate calls
SCRATCH_SLOTS = ("xf",)


def dequantize(blocks: np.ndarray) -> np.ndarray:
    """NumPy reference: (n, 2) u8 -> (n, 1) f32."""
    return blocks.copy().view(np.float16).astype(np.float32)


def pack(raw: np.ndarray) -> tuple:
    """The rows as stored, copied out of the read-only file mapping (a zero-row tail)."""
    return np.array(raw, dtype=np.uint8, order="C"), np.zeros((0, raw.shape[1]), np.uint8)


@njit(cache=True, inline="always")
def _halved(x, scratch):
    xh = rows_of(scratch.xf, x.shape[0], x.shape[1])
    for t in range(x.shape[0]):
        for k in range(x.shape[1]):
            xh[t, k] = round_to_half(x[t, k])
    return xh


@njit(cache=True, inline="always")
def _row(halves, xh, out, r):
    for t in range(xh.shape[0]):
        acc = np.float32(0.0)
        for k in range(xh.shape[1]):
            acc += half_to_float(halves[r, k]) * xh[t, k]
        out[t, r] = acc


@njit(MATMUL_SIGNATURE, cache=True, nogil=True)
def matmul_serial(packed, tail, part_ends, x, scratch, outs):
    """W F16 (rows, K*2 B) @ x (T, K) -> outs[0] (T, rows), on this thread."""
    halves, xh = packed.view(np.uint16), _halved(x, scratch)
    first, last = team_share(scratch, halves.shape[0])
    for r in range(first, last):
        _row(halves, xh, outs[0], r)


@njit(MATMUL_SIGNATURE, cache=True, parallel=True)
def matmul_parallel(packed, tail, part_ends, x, scratch, outs):
    """The same, rows on numba's thread pool when big enough."""
    halves, xh = packed.view(np.uint16), _halved(x, scratch)
    if x.shape[0] * x.shape[1] * halves.shape[0] < PARALLEL_MIN_MACS:
        for r in range(halves.shape[0]):
            _row(halves, xh, outs[0], r)
    else:
        for r in prange(halves.shape[0]):
            _row(halves, xh, outs[0], r)
