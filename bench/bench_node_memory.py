"""Resident memory of the node, ready and idle, by kind of mapping (README, "Models").

    .venv/bin/python bench/bench_node_memory.py --model qwen2.5-coder-1.5b-instruct-q4_k_m [--pool-mb 64]
Starts the node in its own process (test/ros/node_harness.py), waits for pool_status, then sums
/proc/PID/smaps by mapping: anonymous memory and heap (weights, KV, buffers, Python objects), the
model file's pages, llvmlite (numba's compiled code), and every other library.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "test" / "ros"))
sys.path.insert(0, str(REPO))

from node_harness import running_node   # noqa: E402


def resident_by_kind(pid: int, model_path: str) -> dict:
    """MiB resident per kind of mapping of process pid."""
    totals: dict = defaultdict(int)
    kind = "other"
    for line in open(f"/proc/{pid}/smaps"):
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            parts = line.split()
            name = parts[5] if len(parts) > 5 else ""
            if name in ("", "[heap]"):
                kind = "anonymous_and_heap"
            elif os.path.realpath(name) == os.path.realpath(model_path):
                kind = "model_file"
            elif "llvmlite" in name:
                kind = "llvmlite"
            else:
                kind = "libraries_and_other"
        elif line.startswith("Rss:"):
            totals[kind] += int(line.split()[1])
    return {k: round(v / 1024, 1) for k, v in sorted(totals.items())}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="a catalog name or a GGUF path")
    parser.add_argument("--pool-mb", type=float, default=64.0)
    args = parser.parse_args()
    from edge_slm_node.model.loader import resolve_model_path
    model_path = resolve_model_path(args.model)
    env = dict(os.environ, ROS_DOMAIN_ID=str(60 + os.getpid() % 40))
    with tempfile.TemporaryDirectory() as directory, running_node(
            Path(directory), env, model_path=model_path, kv_pool_mb=args.pool_mb, max_context_tokens=2048) as client:
        time.sleep(3.0)                                   # idle: the prefill's transient buffers settled
        report = {"model": model_path, "pool_mb": args.pool_mb,
                  "rss_mib": round(client.latest_pool().rss_bytes / 2**20, 1),
                  "by_kind_mib": resident_by_kind(client.node_process.process.pid, model_path)}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
