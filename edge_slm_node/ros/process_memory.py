"""Process-wide memory settings that must be made before rclpy starts its middleware and threads.

A command is deserialized in full before the node can refuse it, so a client sending 1 MB
texts or sixteen 1 MB stop strings makes the process allocate that much. Two things keep
that memory from staying resident after the messages are refused:
- Fast DDS readers allocate each sample dynamically instead of keeping a pool of buffers
  grown to the largest message seen (config/fastdds_memory.xml);
- one malloc arena instead of one per thread, so engine.memory.release_free_heap can hand the
  freed pages back (per-thread arenas keep them scattered).
Measured with test/ros/hostile_client.py oversized for 20 s (README, "Hostile clients").
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

from ..engine.config_files import config_dir

M_ARENA_MAX = -8           # glibc mallopt parameter
PROFILE_FILE = "fastdds_memory.xml"


def own_profile_loaded() -> bool:
    """Whether this process runs with config/fastdds_memory.xml (not a profile file of the user's)."""
    return os.environ.get("FASTDDS_DEFAULT_PROFILES_FILE") == os.path.join(config_dir(), PROFILE_FILE)


def configure_process_memory() -> list[str]:
    """Apply both settings unless the user configured them; -> what was applied (for the log)."""
    applied = []
    if not (os.environ.get("FASTDDS_DEFAULT_PROFILES_FILE") or os.environ.get("FASTRTPS_DEFAULT_PROFILES_FILE")):
        profile = os.path.join(config_dir(), PROFILE_FILE)
        if os.path.isfile(profile):
            os.environ["FASTDDS_DEFAULT_PROFILES_FILE"] = profile    # Fast DDS >= 2.10
            os.environ["FASTRTPS_DEFAULT_PROFILES_FILE"] = profile   # older Fast DDS (Humble)
            os.environ.setdefault("RMW_FASTRTPS_USE_QOS_FROM_XML", "1")
            applied.append(f"Fast DDS profile {profile}")
    if "MALLOC_ARENA_MAX" not in os.environ:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            if libc.mallopt(M_ARENA_MAX, 1) == 1:
                applied.append("one malloc arena")
        except (OSError, AttributeError):        # not glibc: nothing to do
            pass
    return applied
