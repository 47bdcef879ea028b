"""Quantized matmul speed on a real model's shapes: each weight type's serial and thread-pool kernels.

    python bench/bench_matmul.py [--model PATH_OR_NAME] [--tokens 1 64] [--rounds 7] [--only gate head]
                                 [--threads 1 2] [--cpu-time] [--no-decode-pass]

Variants are timed interleaved in one process (round-robin, median of per-round medians), at
1 and 2 numba threads. The weights of one matrix stay cache-resident between calls; the
"decode pass" rows run every layer's matmuls plus the output head in model order, so the
weights stream from memory as in real decoding (T=1): per layer 7 calls (q, k, v, o, gate,
up, down) unfused, or 4 (q|k|v, o, gate|up, down) fused where the types allow. "serial" is
matmul_serial (the calling thread), "parallel" matmul_parallel (the pool when the call is big
enough: kernels/quants/common.py). Before/after comparisons: run this at both revisions
(a git worktree of the old one) alternately; the kernels' API changed with the quant table.
--cpu-time: this thread's CPU time instead of wall time, 1 thread (steadier on a shared machine).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numba
import numpy as np
from numba import njit, prange

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from edge_slm_node.kernels.quants.common import new_scratch, set_team  # noqa: E402
from edge_slm_node.model.linear import FusedLinear  # noqa: E402
from edge_slm_node.model.loader import load_model  # noqa: E402

CLOCK = time.perf_counter      # --cpu-time: time.thread_time


@njit(parallel=True)
def empty_region(a):
    for i in prange(a.shape[0]):
        a[i] += 1.0


def region_after_work(probe, gap_us: float, calls: int = 300) -> float:
    """Median seconds of one empty 2-thread region entered after gap_us of main-thread work (in a
    prompt step the pool sleeps between parallel matmuls; waking it costs more the longer)."""
    samples = []
    for _ in range(calls):
        end = time.perf_counter() + gap_us * 1e-6
        while time.perf_counter() < end:
            pass
        started = time.perf_counter()
        empty_region(probe)
        samples.append(time.perf_counter() - started)
    return float(np.median(samples))


def time_calls(fn, calls: int) -> float:
    start = CLOCK()
    for _ in range(calls):
        fn()
    return (CLOCK() - start) / calls


def interleaved(candidates: dict, rounds: int, budget: float = 0.02) -> dict:
    """name -> (threads, fn): median seconds per call over rounds, variants alternating."""
    calls = {}
    for name, (threads, fn) in candidates.items():
        numba.set_num_threads(threads)
        fn()
        calls[name] = max(1, min(200, int(budget / max(time_calls(fn, 1), 1e-7))))
    samples = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, (threads, fn) in candidates.items():
            numba.set_num_threads(threads)
            samples[name].append(time_calls(fn, calls[name]))
    return {name: float(np.median(s)) for name, s in samples.items()}


def row(shape: str, variant: str, threads: int, seconds: float, macs: float) -> None:
    print(f"{shape:<30} {variant:<20} {threads:>7} {seconds * 1e6:>12.1f} {macs / seconds / 1e9:>8.2f}", flush=True)


def shapes(model):
    """(label, matrix or fused group) of layer 0 and the output head."""
    layer, weights = model.weights.layers[0], model.weights
    named = [("q", layer.q), ("k", layer.k), ("v", layer.v), ("o", layer.o), ("gate", layer.gate),
             ("down", layer.down), ("head", weights.output)]
    found = [(f"{n} {m.out_features}x{m.in_features} {m.quant.name}", m) for n, m in named]
    for label, group in (("qkv", FusedLinear([layer.q, layer.k, layer.v])), ("gate|up", FusedLinear([layer.gate, layer.up]))):
        if group.fused:
            rows = sum(p.out_features for p in group.parts)
            found.append((f"{label} {rows}x{group.parts[0].in_features} fused", group))
    return found


def call_of(matrix, tokens: int, parallel: bool, rng, rows_alone: bool = False, team=(0, 1)):
    """-> (fn running matrix on a random x, multiply-adds per call); rows_alone (a Linear): each
    token summed as its own llama.cpp call, as the tokens of a decode step's sessions are;
    team (member, members): matmul_serial computes that member's share of the rows."""
    parts = matrix.parts if isinstance(matrix, FusedLinear) else [matrix]
    k = parts[0].in_features
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    scratch = new_scratch(tokens, k, {s for p in parts for s in p.scratch_slots})
    set_team(scratch, *team)
    outs = [np.zeros((tokens, p.out_features), np.float32) for p in parts]
    macs = tokens * k * sum(p.out_features for p in parts)
    if isinstance(matrix, FusedLinear):
        return (lambda: matrix.apply(x, scratch, outs, parallel)), macs
    return (lambda: matrix.apply(x, scratch, outs[0], parallel, rows_alone)), macs


def decode_pass(model, fused: bool, parallel: bool, rng):
    """One token through every layer's matmuls and the head, in model order."""
    calls = []
    for layer in model.weights.layers:
        groups = [FusedLinear([layer.q, layer.k, layer.v]), layer.o, FusedLinear([layer.gate, layer.up]), layer.down] \
            if fused else [layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down]
        calls += [call_of(m, 1, parallel, rng)[0] for m in groups]
    calls.append(call_of(model.weights.output, 1, parallel, rng)[0])

    def run():
        for call in calls:
            call()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", nargs="*", default=None, help="shapes whose name starts with one of these")
    parser.add_argument("--no-decode-pass", action="store_true")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--cpu-time", action="store_true",
                        help="time this thread's CPU time, 1 thread only (steadier on a shared machine)")
    args = parser.parse_args()
    if args.cpu_time:
        global CLOCK
        CLOCK, args.threads = time.thread_time, [1]
    model = load_model(args.model)
    config = model.config
    print(f"{model.path}\nnumba {numba.__version__}, threading layer ", end="")
    probe = np.zeros(2)
    empty_region(probe)
    print(f"{numba.threading_layer()}, max threads {numba.config.NUMBA_NUM_THREADS}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, load average {os.getloadavg()[0]:.1f}")
    region = interleaved({f"{n}": (n, lambda: empty_region(probe)) for n in args.threads}, args.rounds)
    print("empty prange region: " + ", ".join(f"{n} thread(s) {s * 1e6:.1f} us" for n, s in region.items()))
    if numba.config.NUMBA_NUM_THREADS > 1 and not args.cpu_time:
        numba.set_num_threads(2)
        print("  2 threads, after main-thread work of " + ", ".join(
            f"{gap} us: {region_after_work(probe, gap) * 1e6:.1f} us" for gap in (0, 200, 500, 2000)))

    rng = np.random.default_rng(0)
    print(f"\n{'shape':<30} {'variant':<20} {'threads':>7} {'median us':>12} {'GMAC/s':>8}")
    for tokens in args.tokens:
        print(f"-- T = {tokens}")
        for shape, matrix in shapes(model):
            if args.only is not None and not any(shape.startswith(prefix) for prefix in args.only):
                continue
            candidates, macs = {}, 0
            for parallel in (False, True):
                fn, macs = call_of(matrix, tokens, parallel, rng)
                for threads in args.threads if parallel else [1]:
                    candidates[("parallel" if parallel else "serial", threads)] = (threads, fn)
            for (variant, threads), seconds in sorted(interleaved(candidates, args.rounds).items(),
                                                      key=lambda kv: (kv[0][1], kv[0][0])):
                row(shape, variant, threads, seconds, macs)

    if args.no_decode_pass:
        return
    print(f"-- decode pass (T=1, all {config.num_layers} layers + head, weights streamed from memory)")
    candidates = {}
    for fused in (True, False):
        for parallel in (False, True):
            for threads in args.threads if parallel else [1]:
                label = ("fused" if fused else "7/layer") + (", parallel" if parallel else ", serial")
                candidates[(label, threads)] = (threads, decode_pass(model, fused, parallel, rng))
    layer = model.weights.layers[0]
    layer_macs = sum(p.in_features * p.out_features for p in (layer.q, layer.k, layer.v, layer.o, layer.gate,
                                                               layer.up, layer.down))
    macs = config.num_layers * layer_macs + config.hidden_size * config.vocab_size
    for (variant, threads), seconds in sorted(interleaved(candidates, max(3, args.rounds // 2), budget=0.2).items(),
                                              key=lambda kv: (kv[0][1], kv[0][0])):
        row(f"decode pass {macs / 1e6:.0f}M MAC", variant, threads, seconds, macs)
        print(f"{'':<30} {'':<20} {'':>7} {'-> matmul-only tokens/s':>12} {1 / seconds:.0f}")


if __name__ == "__main__":
    main()
