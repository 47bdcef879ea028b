"""Read bandwidth with 1 and 2 threads: the physical limit of a decode step.

    .venv/bin/python bench/bench_bandwidth.py [--mb 1024] [--passes 9] [--model PATH] [--json]

A numba loop sums an int64 buffer (each thread streams its own contiguous half); the figure is
bytes / seconds of one pass, median of --passes passes after one warm-up pass. The default buffer
(1 GiB) is much larger than the caches of the hosts met so far (L2 1-2 MiB a core, L3 32-300
MiB; the output names this machine's, from /sys), so it measures memory. --mb may be given several
times. With --model, a second buffer the size of the weights one decode step reads
(weight_bytes_per_token below) is measured too: a model that small may decode out of the (shared,
host-wide) L3 instead of memory.
bench_speed.py runs this file in a fresh process and divides decode tokens/s by
(bandwidth / bytes of weights read per token).
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"


def _cache_field(entry: str, name: str) -> str:
    with open(os.path.join(CACHE_DIR, entry, name)) as f:
        return f.read().strip()


def cache_sizes() -> str:
    """This CPU's data and unified caches as the kernel reports them, e.g. "L1 32K, L2 1024K, L3 32768K"
    (one instance each, as /sys lists them: a core's L1 and L2, the L3 its cores share)."""
    found = {}
    try:
        for entry in sorted(os.listdir(CACHE_DIR)):
            if entry.startswith("index") and _cache_field(entry, "type") in ("Data", "Unified"):
                found[int(_cache_field(entry, "level"))] = _cache_field(entry, "size")
    except OSError:
        return "unknown"
    return ", ".join(f"L{level} {size}" for level, size in sorted(found.items())) or "unknown"


def weight_bytes_per_token(model_path: str) -> dict:
    """Bytes of weight matrices one decode step reads, from the GGUF: every 2-D tensor of every
    layer (blk.N.*) plus the output head (output.weight, or token_embd.weight when tied). The
    embedding lookup (one row), norms and biases are left out."""
    from gguf import GGUFReader
    reader = GGUFReader(model_path)
    tensors = {t.name: t for t in reader.tensors}
    layer_bytes = sum(int(t.n_bytes) for t in reader.tensors
                      if t.name.startswith("blk.") and len([d for d in t.shape if d > 1]) >= 2)
    head = tensors.get("output.weight") or tensors["token_embd.weight"]
    return {"layer_matrix_bytes": layer_bytes, "head_bytes": int(head.n_bytes), "head_tensor": head.name,
            "bytes_per_token": layer_bytes + int(head.n_bytes)}


def _kernel():
    import numba

    @numba.njit(inline="always")
    def chunk_sum(view):
        # view (m,) int64, contiguous -> its sum (a plain loop over a view vectorizes; indexing the
        # whole buffer with computed bounds inside prange did not, and ran at scalar speed)
        total = 0
        for i in range(view.size):
            total += view[i]
        return total

    @numba.njit(parallel=True, cache=True)
    def read_sum(buffer, parts):
        # buffer (n,) int64, parts threads -> sum of all elements (each part streams n / parts)
        per_part = buffer.size // parts
        sums = np.zeros(parts, np.int64)
        for part in numba.prange(parts):
            sums[part] = chunk_sum(buffer[part * per_part:(part + 1) * per_part])
        return sums.sum()

    return numba, read_sum


def measure(megabytes: float, threads: int, passes: int) -> dict:
    """One pass reads the buffer `repeats` times (at least 512 MiB), so small buffers time well too."""
    numba, read_sum = _kernel()
    numba.set_num_threads(threads)
    buffer = np.ones(int(megabytes * 2**20) // 8, np.int64)          # touched: no page faults while timed
    repeats = max(1, int(512 // megabytes))
    read_sum(buffer, threads)                                          # compile + warm-up
    seconds = []
    for _ in range(passes):
        started = time.perf_counter()
        for _ in range(repeats):
            read_sum(buffer, threads)
        seconds.append((time.perf_counter() - started) / repeats)
    rates = [buffer.nbytes / s / 1e9 for s in seconds]
    return {"mb": megabytes, "threads": threads, "gb_per_s": statistics.median(rates),
            "min_gb_per_s": min(rates), "max_gb_per_s": max(rates), "passes": passes, "repeats": repeats}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, action="append", help="buffer MiB (repeatable; default 1024)")
    parser.add_argument("--passes", type=int, default=9)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--model", help="also a buffer of the weights a decode step reads (a GGUF path)")
    parser.add_argument("--json", action="store_true", help="one JSON line instead of the table")
    args = parser.parse_args()
    sizes = args.mb or [1024.0]
    weights = None
    if args.model:
        weights = weight_bytes_per_token(args.model)
        sizes.append(round(weights["bytes_per_token"] / 2**20, 1))
    results = [measure(mb, int(t), args.passes) for mb in sizes for t in args.threads.split(",")]
    if args.json:
        print(json.dumps({"results": results, "weights": weights, "cpu_count": os.cpu_count(),
                          "caches": cache_sizes(), "loadavg": os.getloadavg()}))
        return
    print(f"read bandwidth, median of {args.passes} passes (caches: {cache_sizes()}); "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for r in results:
        print(f"  {r['mb']:8.1f} MiB  {r['threads']} thread(s)  {r['gb_per_s']:6.1f} GB/s  "
              f"(passes {r['min_gb_per_s']:.1f}-{r['max_gb_per_s']:.1f})")
    if weights:
        print(f"weights read per decode step: {weights['bytes_per_token'] / 2**20:.1f} MiB "
              f"(layer matrices {weights['layer_matrix_bytes'] / 2**20:.1f} MiB + head {weights['head_tensor']} "
              f"{weights['head_bytes'] / 2**20:.1f} MiB)")


if __name__ == "__main__":
    sys.exit(main())
