"""This process's memory as the OS sees it: available RAM, resident size, handing free heap back."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource


def mem_available_bytes(meminfo_path: str = "/proc/meminfo") -> int:
    with open(meminfo_path) as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError(f"MemAvailable not found in {meminfo_path}")


def resident_bytes() -> int:
    """Current resident set size of this process."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def resident_by_mapping(pid="self") -> dict:
    """KiB resident per mapping name of a process ("[anon]" for unnamed ones), from /proc/PID/smaps."""
    totals: dict = {}
    name = "[anon]"
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and ":" not in fields[0]:
                name = fields[5] if len(fields) > 5 else "[anon]"
            elif fields[0] == "Rss:":
                totals[name] = totals.get(name, 0) + int(fields[1])
    return totals


def release_free_heap() -> bool:
    """Give the C heap's free pages back to the OS (glibc malloc_trim(0), every arena).

    Large client messages (deserialized by rclpy on executor threads) land in per-thread
    malloc arenas, which keep their freed pages; without this the resident size stays at
    its high-water mark after a flood. Returns False where malloc_trim does not exist."""
    trim = _malloc_trim()
    return bool(trim is not None and trim(0) >= 0)


def _malloc_trim():
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _MALLOC_TRIM = libc.malloc_trim
            _MALLOC_TRIM.argtypes, _MALLOC_TRIM.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):
            _MALLOC_TRIM = False
    return _MALLOC_TRIM or None


_MALLOC_TRIM = None
