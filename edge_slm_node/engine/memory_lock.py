"""Keep the engine's long-lived memory in RAM with mlock(2): weights, KV arena, activation buffers.

Under memory pressure Linux may swap anonymous pages out or drop file pages; the next decode
step then waits on the disk for every page it touches. Locked pages stay resident (the kernel
counts them in VmLck). Locking needs CAP_IPC_LOCK (root has it) or an RLIMIT_MEMLOCK at least
the locked size; the soft limit is raised to the hard limit first, which needs no privilege.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import resource
from typing import Iterable

import numpy as np

MIB = 2**20
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mlock.argtypes = _libc.munlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)


class MemoryLockError(RuntimeError):
    pass


def page_ranges(arrays: Iterable[np.ndarray]) -> list[tuple[int, int]]:
    """[start, end) address ranges of the pages under the arrays, sorted and merged."""
    page = mmap.PAGESIZE
    spans = []
    for array in arrays:
        if array is None or array.nbytes == 0:
            continue
        if not (array.flags.c_contiguous or array.flags.f_contiguous):
            raise ValueError("lock_arrays needs contiguous arrays (pass the storage, not a strided view)")
        start = array.ctypes.data // page * page
        spans.append((start, -(-(array.ctypes.data + array.nbytes) // page) * page))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def lock_arrays(arrays: Iterable[np.ndarray]) -> int:
    """mlock the pages under every array -> bytes locked. On failure unlocks what it locked and
    raises MemoryLockError saying how much was needed, the limit, and how to raise it."""
    ranges = page_ranges(arrays)
    total = sum(end - start for start, end in ranges)
    _raise_soft_limit()
    done = []
    for start, end in ranges:
        if _libc.mlock(start, end - start) != 0:
            code = ctypes.get_errno()
            for s, e in done:
                _libc.munlock(s, e - s)
            raise MemoryLockError(_failure(code, total))
        done.append((start, end))
    return total


def unlock_arrays(arrays: Iterable[np.ndarray]) -> None:
    for start, end in page_ranges(arrays):
        _libc.munlock(start, end - start)


def locked_bytes_of_process(status_path: str = "/proc/self/status") -> int:
    """VmLck: what the kernel holds locked for this process (0 if unknown)."""
    try:
        with open(status_path) as handle:
            for line in handle:
                if line.startswith("VmLck:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _raise_soft_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
        except (ValueError, OSError):
            pass


def _failure(code: int, needed: int) -> str:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft / MIB:.1f} MiB"
    return (f"lock_memory: mlock of {needed / MIB:.1f} MiB (weights, KV pool, buffers) failed: "
            f"{errno.errorcode.get(code, code)} ({os.strerror(code)}); RLIMIT_MEMLOCK is {limit}. "
            f"Raise it (ulimit -l, systemd LimitMEMLOCK=, docker --ulimit memlock=), grant CAP_IPC_LOCK, "
            f"or set lock_memory: false")
