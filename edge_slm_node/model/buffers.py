"""Buffers allocated once at start and made resident then, so that decoding takes no page faults."""
import numpy as np


def resident_zeros(shape, dtype) -> np.ndarray:
    """Zeros whose pages are touched now. np.zeros maps pages lazily: a buffer region first
    reached mid-decode (a longer context, more sessions at once) would page-fault then, and an
    out-of-memory would surface mid-shift instead of at start."""
    array = np.empty(shape, dtype)
    array.fill(0)
    return array
