"""F32 weights (4-byte floats, kept in the file mapping): plain dot products, no repacking.
Test models and small norm-like matrices use it; no activation quantization."""
import numpy as np
from numba import njit, prange

from .common import MATMUL_SIGNATURE, PARALLEL_MIN_MACS, team_share

FUSABLE = False          # writes outs[0] only: q|k|v and gate|up run as separate calls
SCRATCH_SLOTS = ()


def dequantize(blocks: np.ndarray) -> np.ndarray:
    """NumPy reference: (n, 4) u8 -> (n, 1) f32."""
    return blocks.copy().view(np.float32)


def pack(raw: np.ndarray) -> tuple:
    """The rows as stored, copied out of the read-only file mapping (a zero-row tail)."""
    return np.array(raw, dtype=np.uint8, order="C"), np.zeros((0, raw.shape[1]), np.uint8)


@njit(cache=True, inline="always")
def _row(floats, x, out, r):
    for t in range(x.shape[0]):
        acc = np.float32(0.0)
        for k in range(x.shape[1]):
            acc += floats[r, k] * x[t, k]
        out[t, r] = acc


@njit(MATMUL_SIGNATURE, cache=True, nogil=True)
def matmul_serial(packed, tail, part_ends, x, scratch, outs):
    """W F32 (rows, K*4 B) @ x (T, K) -> outs[0] (T, rows), on this thread."""
    floats = packed.view(np.float32)
    first, last = team_share(scratch, floats.shape[0])
    for r in range(first, last):
        _row(floats, x, outs[0], r)


@njit(MATMUL_SIGNATURE, cache=True, parallel=True)
def matmul_parallel(packed, tail, part_ends, x, scratch, outs):
    """The same, rows on numba's thread pool when big enough."""
    floats = packed.view(np.float32)
    if x.shape[0] * x.shape[1] * floats.shape[0] < PARALLEL_MIN_MACS:
        for r in range(floats.shape[0]):
            _row(floats, x, outs[0], r)
    else:
        for r in prange(floats.shape[0]):
            _row(floats, x, outs[0], r)
