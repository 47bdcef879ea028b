"""Quantized matmul speed on the real SmolLM2 shapes: GGUF-layout reference vs packed kernels.

    python bench/bench_matmul.py [--tokens 1 64] [--rounds 7] [--no-reference] [--only gate head]
                                 [--baseline REV] [--threads 1 2]

Variants are timed interleaved in one process (round-robin, median of per-round medians), at
1 and 2 numba threads. The weights of one matrix stay cache-resident between calls; the
"decode pass" rows run every layer's matmuls plus the output head in model order, so the
weights stream from memory as in real decoding (T=1): per layer 7 calls (q, k, v, o, gate,
up, down) unfused, or 4 (qkv, o, gate|up, down) fused. "on pool": every call on numba's thread pool;
otherwise calls below linear.PARALLEL_MIN_BYTES / PARALLEL_MIN_MACS run on the calling thread.
--cpu-time: this thread's CPU time instead of wall time, 1 thread (other processes' time slices
are not counted; use it on a shared machine). --baseline REV: also times the package as of git revision REV (a temporary copy importable as
edge_slm_node_baseline, with its own weights), interleaved with the working tree: before/after
in one process ("baseline ..." rows).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numba
import numpy as np
from numba import njit, prange

REPO_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, REPO_ROOT)

from baseline import load_baseline  # noqa: E402
from edge_slm_node.kernels import matmul, matmul_rows  # noqa: E402
from edge_slm_node.kernels.half import HALF_TO_FLOAT  # noqa: E402
from edge_slm_node.model import linear as linear_module  # noqa: E402
from edge_slm_node.model import loader as loader_module  # noqa: E402
from edge_slm_node.model.quant import Q4_0, Q4_1, Q8_0  # noqa: E402


def reference_apply(linear, prepared, out):
    """The GGUF-layout kernels (pre-repack) on the file bytes."""
    quant = linear.quant
    if quant is Q4_1:
        matmul_rows.matmul_q4_1(linear.raw, prepared.xq, prepared.xd, prepared.xs, HALF_TO_FLOAT, out)
    elif quant is Q4_0:
        matmul_rows.matmul_q4_0(linear.raw, prepared.xq, prepared.xd, HALF_TO_FLOAT, out)
    elif quant is Q8_0:
        matmul_rows.matmul_q8_0(linear.raw, prepared.xq, prepared.xd, HALF_TO_FLOAT, out)


def on_pool(fn):
    """fn with every packed matmul on numba's thread pool (no small-call serial path)."""
    def run():
        limits = linear_module.PARALLEL_MIN_BYTES, linear_module.PARALLEL_MIN_MACS
        linear_module.PARALLEL_MIN_BYTES = linear_module.PARALLEL_MIN_MACS = 0
        try:
            fn()
        finally:
            linear_module.PARALLEL_MIN_BYTES, linear_module.PARALLEL_MIN_MACS = limits
    return run


class Package:
    """One version of the package under test: its model, fused q|k|v and gate|up, PreparedInput."""

    def __init__(self, label: str, loader, linear):
        self.label = label
        self.linear = linear
        self.model = loader.load_model()
        self.qkv = [linear.FusedLinear([l.q, l.k, l.v]) for l in self.model.weights.layers]
        self.gate_up = [linear.FusedLinear([l.gate, l.up]) for l in self.model.weights.layers]

    def shapes(self):
        layer, weights = self.model.weights.layers[0], self.model.weights
        return [("q 576x576", layer.q), ("k 192x576", layer.k), ("o 576x576", layer.o),
                ("gate 1536x576", layer.gate), ("down 576x1536", layer.down),
                ("head 49152x576 Q8_0", weights.output),
                ("qkv 960x576 fused", self.qkv[0]), ("gate|up 3072x576 fused", self.gate_up[0])]

    def variant(self, name: str) -> str:
        return f"{self.label}{name}"


@njit(parallel=True)
def empty_region(a):
    for i in prange(a.shape[0]):
        a[i] += 1.0


CLOCK = time.perf_counter      # --cpu-time: time.thread_time (this thread's CPU time; 1 thread only)


def region_after_work(probe, gap_us: float, calls: int = 300) -> float:
    """Median seconds of one empty 2-thread region entered after gap_us of main-thread work (in a
    decode step the pool sleeps 0.5-1 ms between parallel matmuls; waking it costs more the longer)."""
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
    print(f"{shape:<22} {variant:<24} {threads:>7} {seconds * 1e6:>12.1f} {macs / seconds / 1e9:>8.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-reference", action="store_true", help="skip the slow GGUF-layout kernels")
    parser.add_argument("--only", nargs="*", default=None, help="shapes whose name starts with one of these")
    parser.add_argument("--no-decode-pass", action="store_true")
    parser.add_argument("--baseline", metavar="REV", help="also time the package at this git revision")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--cpu-time", action="store_true",
                        help="time this thread's CPU time, 1 thread only (steadier on a shared machine)")
    args = parser.parse_args()
    if args.cpu_time:
        global CLOCK
        CLOCK, args.threads = time.thread_time, [1]

    packages = [Package("", loader_module, linear_module)]
    if args.baseline:
        packages.append(Package("baseline ", *load_baseline(args.baseline, "model.loader", "model.linear")))
        print(f"baseline: git revision {args.baseline}")
    model = packages[0].model
    weights, config = model.weights, model.config
    layer = weights.layers[0]
    print(f"numba {numba.__version__}, threading layer ", end="")
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

    print(f"\n{'shape':<22} {'variant':<24} {'threads':>7} {'median us':>12} {'GMAC/s':>8}")
    for tokens in args.tokens:
        print(f"-- T = {tokens}")
        for index, (shape, _) in enumerate(packages[0].shapes()):
            if args.only is not None and not any(shape.startswith(prefix) for prefix in args.only):
                continue
            candidates = {}
            for package in packages:
                linear = package.shapes()[index][1]
                fused = isinstance(linear, package.linear.FusedLinear)
                parts = linear.parts if fused else [linear]
                k = parts[0].in_features
                x = np.random.default_rng(tokens).standard_normal((tokens, k)).astype(np.float32)
                prepared = package.linear.PreparedInput(tokens, k, True, False).prepare(x)
                outs = tuple(np.zeros((tokens, p.out_features), np.float32) for p in parts)
                macs = tokens * k * sum(p.out_features for p in parts)
                if fused:
                    call = (lambda linear=linear, prepared=prepared, outs=outs: linear.apply(prepared, outs))
                    separate = (lambda parts=parts, prepared=prepared, outs=outs:
                                [p.apply(prepared, o) for p, o in zip(parts, outs)])
                else:
                    call = (lambda linear=linear, prepared=prepared, outs=outs: linear.apply(prepared, outs[0]))
                for threads in args.threads:
                    name = "packed fused" if fused else "packed"
                    candidates[(package.variant(name), threads)] = (threads, call)
                    if fused and not package.label:
                        candidates[(package.variant("packed separate"), threads)] = (threads, separate)
                    if threads > 1 and not package.label:
                        candidates[(package.variant(name + ", on pool"), threads)] = (threads, on_pool(call))
                    if not fused and not package.label and not args.no_reference:
                        candidates[("reference", threads)] = (
                            threads, lambda linear=linear, prepared=prepared, outs=outs:
                            reference_apply(linear, prepared, outs[0]))
            result = interleaved(candidates, args.rounds)
            for (variant, threads), seconds in sorted(result.items(), key=lambda kv: (kv[0][1], kv[0][0])):
                row(shape, variant, threads, seconds, macs)

    if args.no_decode_pass:
        return
    print("-- decode pass (T=1, all 30 layers + head, weights streamed from memory)")
    candidates = {}
    for package in packages:
        fused_pass, separate, reference_pass = decode_passes(package, np.random.default_rng(0))
        for threads in args.threads:
            candidates[(package.variant("packed fused, 4/layer"), threads)] = (threads, fused_pass)
            if package.label:
                continue
            candidates[("packed, 7/layer", threads)] = (threads, separate)
            if threads > 1:
                candidates[("fused, on pool", threads)] = (threads, on_pool(fused_pass))
                candidates[("7/layer, on pool", threads)] = (threads, on_pool(separate))
            if not args.no_reference:
                candidates[("reference, 7/layer", threads)] = (threads, reference_pass)
    layer_macs = sum(p.in_features * p.out_features for p in (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down))
    macs = config.num_layers * layer_macs + config.hidden_size * config.vocab_size
    result = interleaved(candidates, max(3, args.rounds // 2), budget=0.2)
    for (variant, threads), seconds in sorted(result.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        row(f"decode pass {macs / 1e6:.0f}M MAC", variant, threads, seconds, macs)
        print(f"{'':<22} {'':<24} {'':>7} {'-> matmul-only tokens/s':>12} {1 / seconds:.0f}")


def decode_passes(package: Package, rng):
    """-> (fused pass, 7-calls-per-layer pass, GGUF-layout reference pass) of one token through
    every layer's matmuls and the head, on package's own weights and buffers."""
    weights, config, linear = package.model.weights, package.model.config, package.linear
    qkv, gate_up = package.qkv, package.gate_up
    hidden, inter = config.hidden_size, config.intermediate_size
    x_hidden = linear.PreparedInput(1, hidden, True, False).prepare(rng.standard_normal((1, hidden)).astype(np.float32))
    x_inter = linear.PreparedInput(1, inter, True, False).prepare(rng.standard_normal((1, inter)).astype(np.float32))
    x_head = linear.PreparedInput(1, hidden, True, False).prepare(rng.standard_normal((1, hidden)).astype(np.float32))
    q, k, v = (np.zeros((1, n), np.float32) for n in (config.q_size, config.kv_size, config.kv_size))
    o, g, u, d = (np.zeros((1, n), np.float32) for n in (hidden, inter, inter, hidden))
    logits = np.zeros((1, config.vocab_size), np.float32)

    def separate():
        for l in weights.layers:
            l.q.apply(x_hidden, q), l.k.apply(x_hidden, k), l.v.apply(x_hidden, v), l.o.apply(x_hidden, o)
            l.gate.apply(x_hidden, g), l.up.apply(x_hidden, u), l.down.apply(x_inter, d)
        weights.output.apply(x_head, logits)

    def fused_pass():
        for i, l in enumerate(weights.layers):
            qkv[i].apply(x_hidden, (q, k, v))
            l.o.apply(x_hidden, o)
            gate_up[i].apply(x_hidden, (g, u))
            l.down.apply(x_inter, d)
        weights.output.apply(x_head, logits)

    def reference_pass():
        for l in weights.layers:
            for lin, x, out in ((l.q, x_hidden, q), (l.k, x_hidden, k), (l.v, x_hidden, v), (l.o, x_hidden, o),
                                (l.gate, x_hidden, g), (l.up, x_hidden, u), (l.down, x_inter, d)):
                reference_apply(lin, x, out)
        reference_apply(weights.output, x_head, logits)

    return fused_pass, separate, reference_pass

if __name__ == "__main__":
    main()
