"""Buffers allocated once at start and made resident then, so that decoding takes no page faults;
optionally each followed by a guard zone of canary bytes (numba does not bounds-check)."""
from __future__ import annotations

import numpy as np

GUARD_BYTES = 64                   # after every buffer: more than one vector store past its end
CANARY = 0xA5


def resident_zeros(shape, dtype) -> np.ndarray:
    """Zeros whose pages are touched now. np.zeros maps pages lazily: a buffer region first
    reached mid-decode (a longer context, more sessions at once) would page-fault then, and an
    out-of-memory would surface mid-shift instead of at start."""
    array = np.empty(shape, dtype)
    array.fill(0)
    return array


class GuardZones:
    """Allocates named resident buffers, each followed by GUARD_BYTES of CANARY when enabled;
    breaches() names the buffers whose canary changed. Disabled, it allocates plain buffers."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._guards: list = []          # (name, canary view)

    def zeros(self, name: str, shape, dtype) -> np.ndarray:
        if not self.enabled:
            return resident_zeros(shape, dtype)
        dtype = np.dtype(dtype)
        size = int(np.prod(shape)) * dtype.itemsize
        raw = np.empty(size + GUARD_BYTES, np.uint8)
        raw[:size] = 0
        raw[size:] = CANARY
        self._guards.append((name, raw[size:]))
        return raw[:size].view(dtype).reshape(shape)

    def breaches(self) -> list:
        return [name for name, canary in self._guards if (canary != CANARY).any()]

    @property
    def count(self) -> int:
        return len(self._guards)
