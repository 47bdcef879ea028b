"""Paged attention and KV-write speed: the frozen pre-vectorization kernels vs the current ones.

    .venv/bin/python bench/bench_attention.py [--rounds 7] [--calls 30] [--threads 2] [--baseline REV]
                                              [--avx512]

SmolLM2-135M shapes (9 query heads, 3 KV heads, head_dim 64, 16-token blocks). Each call uses
the next of 30 layers of a real-sized arena (blocks scattered), so K/V come from the cache
hierarchy as in a forward pass rather than from L1. Variants run interleaved in one process;
the table shows the median microseconds per call (one layer). "old" is the frozen copy in
test/kernels/test_attention.py (old arena layout); "new" is kernels/attention.py on the
KVArena layout (auto = serial/parallel chosen by attention.PARALLEL_MIN_MACS), and on the old
layout for comparison. --baseline REV adds kernels/attention.py as of git revision REV
("baseline auto"), interleaved with the working tree: before/after in one process. --avx512: the
AVX-512 build's summation orders (what the engine uses on such CPUs) for "new" and "baseline";
"old" has only the AVX2 ones. Before 443363d, paged_attention() let numba dispatch its omitted
arguments, ~90 us a serial call: a baseline older than that is not comparable.

The last rows time what a team member's attention costs in a 4-session decode step: one njit
loop over every layer of 4 sequences (one token each, contexts ~STEP_CONTEXT), serial, after a 48 MiB
sweep that evicts the KV as a step's weight traffic does ("cold"), and again without it
("warm"); CPU time of one whole pass, divided by layers x sessions.
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time

import numba
import numpy as np
from numba import njit

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from baseline import load_baseline  # noqa: E402
from edge_slm_node.kernels import attention, kv_write  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
LAYERS = 30


def load_reference():
    """test/kernels/test_attention.py, under the module name pytest gives it (numba's cache keys on it)."""
    sys.path.insert(0, os.path.join(ROOT, "test", "kernels"))
    return importlib.import_module("test_attention")


def make_case(rng, num_tokens, last_context, prompt_order, num_blocks):
    """One sequence: tokens at contexts last_context - num_tokens + 1 .. last_context."""
    needed = -(-last_context // BLOCK)
    table = rng.permutation(num_blocks)[:needed].astype(np.int32)[None, :]
    context = np.arange(last_context - num_tokens + 1, last_context + 1, dtype=np.int32)
    return dict(q=rng.standard_normal((num_tokens, HEADS, HEAD_DIM)).astype(np.float32),
                tables=table, seq=np.zeros(num_tokens, np.int32), context=context,
                prompt_order=np.full(num_tokens, prompt_order, np.uint8),
                slots=(table[0, (context - 1) // BLOCK] * BLOCK + (context - 1) % BLOCK).astype(np.int32),
                k=rng.standard_normal((num_tokens, KV_HEADS, HEAD_DIM)).astype(np.float32),
                v=rng.standard_normal((num_tokens, KV_HEADS, HEAD_DIM)).astype(np.float32))


STEP_SESSIONS, STEP_CONTEXT, STEP_BLOCKS_EACH = 4, 128, 16


def make_arena(rng, num_blocks):
    """Random fp16 KV of LAYERS layers in KVArena's layout (each block's rows of one head contiguous)."""
    bits = rng.standard_normal((LAYERS, 2, num_blocks, KV_HEADS, BLOCK, HEAD_DIM)).astype(np.float16).view(np.uint16)
    return bits.transpose(0, 1, 2, 4, 3, 5)


def step_pass(module):
    """An njit loop: one decode token of each of STEP_SESSIONS sequences through every layer's
    attention, on the calling thread (module: kernels.attention of the tree timed)."""
    serial = module.paged_attention_serial

    @njit(nogil=True)
    def run(q, arena, tables, seq, context, order, scale, out, work):
        for layer in range(arena.shape[0]):         # avx512, no window, member 0 of 1
            serial(q, arena[layer, 0], arena[layer, 1], tables, seq, context, order, scale, out, work, True, 0, 0, 1)
    return run


def step_rows(rng, modules, rounds):
    """-> [(label, {variant: median us per layer and session})] for the 4-session decode step."""
    blocks = STEP_SESSIONS * STEP_BLOCKS_EACH
    arena = make_arena(rng, blocks)
    tables = rng.permutation(blocks).astype(np.int32).reshape(STEP_SESSIONS, STEP_BLOCKS_EACH)
    context = (STEP_CONTEXT + np.array([-7, 3, -2, 6]))[:STEP_SESSIONS].astype(np.int32)
    q0 = rng.standard_normal((STEP_SESSIONS, HEADS, HEAD_DIM)).astype(np.float32)
    args = (tables, np.arange(STEP_SESSIONS, dtype=np.int32), context, np.zeros(STEP_SESSIONS, np.uint8),
            np.float32(1.0) / np.sqrt(np.float32(HEAD_DIM)), np.zeros_like(q0))
    sweep = np.zeros(48 << 20, np.uint8)
    runs = {name: (step_pass(module), module.attention_work(HEADS, KV_HEADS, HEAD_DIM, 1024))
            for name, module in modules.items()}
    q = q0.copy()
    for run, work in runs.values():                                # compile
        run(q, arena, *args, work)
    rows = []
    for label, cold in ((f"decode step: 4 sessions, context ~{STEP_CONTEXT}, cold", True),
                        (f"decode step: 4 sessions, context ~{STEP_CONTEXT}, warm", False)):
        samples = {name: [] for name in runs}
        for _ in range(rounds * 10):
            for name, (run, work) in runs.items():
                if cold:
                    sweep += 1
                q[:] = q0
                start = time.thread_time_ns()
                run(q, arena, *args, work)
                samples[name].append((time.thread_time_ns() - start) / 1000 / (LAYERS * STEP_SESSIONS))
        rows.append((label, {name: statistics.median(values) for name, values in samples.items()}))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=30, help="calls per variant per round (one per layer)")
    parser.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS)
    parser.add_argument("--baseline", metavar="REV", help="also time kernels/attention.py at this git revision")
    parser.add_argument("--avx512", action="store_true", help="the AVX-512 build's orders (new and baseline)")
    args = parser.parse_args()
    baseline = load_baseline(args.baseline, "kernels.attention")[0] if args.baseline else None
    numba.set_num_threads(args.threads)
    ref = load_reference()
    rng = np.random.default_rng(0)
    num_blocks = 96
    arena_new = make_arena(rng, num_blocks)
    arena_old = np.ascontiguousarray(arena_new)                   # (.., blocks, block_size, kv_heads, d)
    scale = np.float32(1.0) / np.sqrt(np.float32(HEAD_DIM))
    threads = numba.config.NUMBA_NUM_THREADS
    group = HEADS // KV_HEADS
    work = attention.attention_work(HEADS, KV_HEADS, HEAD_DIM, 1024)
    baseline_work = baseline.attention_work(HEADS, KV_HEADS, HEAD_DIM, 1024) if baseline else None
    old_scratch = (np.zeros((threads, group, 1024), np.float32), np.zeros((threads, group, 32, HEAD_DIM), np.float32),
                   np.zeros((threads, HEAD_DIM), np.uint32), np.zeros((threads, HEAD_DIM), np.float32))

    cases = [("decode T=1, context 64", make_case(rng, 1, 64, 0, num_blocks)),
             ("decode T=1, context 300", make_case(rng, 1, 300, 0, num_blocks)),
             ("decode T=1, context 1000", make_case(rng, 1, 1000, 0, num_blocks)),
             ("prefill 30 tokens at context 318", make_case(rng, 30, 318, 1, num_blocks)),
             ("prefill 256 tokens from 0", make_case(rng, 256, 256, 1, num_blocks))]

    def attention_variants(case):
        out = np.zeros_like(case["q"])
        q = case["q"].copy()
        common = (case["tables"], case["seq"], case["context"], case["prompt_order"], scale)

        def old(layer):
            ref.reference_paged_attention(q, arena_old[layer, 0], arena_old[layer, 1], *common, *old_scratch, out)

        def new(arena, parallel):
            def run(layer):
                q[:] = case["q"]
                attention.paged_attention(q, arena[layer, 0], arena[layer, 1], *common, out, work, parallel=parallel,
                                          avx512=args.avx512)
            return run
        variants = {"old": old, "new auto": new(arena_new, None), "new serial": new(arena_new, False),
                    "new parallel": new(arena_new, True), "new auto, old layout": new(arena_old, None)}
        if baseline is not None:
            def before(layer):
                q[:] = case["q"]
                baseline.paged_attention(q, arena_new[layer, 0], arena_new[layer, 1], *common, out, baseline_work,
                                         avx512=args.avx512)
            variants["baseline auto"] = before
        return variants

    def write_variants(case):
        kv_bits = np.zeros((case["k"].shape[0], HEAD_DIM), np.uint16)
        row, bits = np.zeros(HEAD_DIM, np.float32), np.zeros(8, np.uint16)

        def old(layer):
            ref.reference_write_kv(case["k"], case["v"], case["slots"], arena_old[layer, 0], arena_old[layer, 1], kv_bits)

        def new(layer):
            kv_write.write_kv(case["k"], case["v"], case["slots"], arena_new[layer, 0], arena_new[layer, 1], row, bits)
        return {"old": old, "new": new}

    rows = [(f"attention, {name}", attention_variants(case)) for name, case in cases]
    rows += [(f"write_kv, T={case['k'].shape[0]}", write_variants(case)) for _, case in (cases[1], cases[3], cases[4])]
    columns = ["old", "baseline auto", "new auto", "new serial", "new parallel", "new auto, old layout", "new"]
    timings = {(label, v): [] for label, variants in rows for v in variants}
    for label, variants in rows:                                   # compile and warm up
        for fn in variants.values():
            fn(0)
    for _ in range(args.rounds):
        for label, variants in rows:
            for v, fn in variants.items():
                samples = []
                for layer in range(args.calls):
                    start = time.perf_counter_ns()
                    fn(layer % LAYERS)
                    samples.append(time.perf_counter_ns() - start)
                timings[(label, v)].append(statistics.median(samples) / 1000)
    print(f"median us per call (one layer), {args.threads} thread(s), {args.rounds} rounds x {args.calls} calls")
    shown = [c for c in columns if any((label, c) in timings for label, _ in rows)]
    print(f"{'':40s}" + "".join(f"{c:>22s}" for c in shown) + f"{'old/new':>10s}")
    for label, variants in rows:
        cells, medians = [], {}
        for c in shown:
            if (label, c) in timings:
                medians[c] = statistics.median(timings[(label, c)])
                cells.append(f"{medians[c]:22.1f}")
            else:
                cells.append(f"{'':>22s}")
        best_new = medians.get("new auto", medians.get("new"))
        print(f"{label:40s}" + "".join(cells) + f"{medians['old'] / best_new:9.1f}x")
    modules = {"new serial": attention}
    if baseline is not None:
        modules["baseline serial"] = baseline
    print(f"\nmedian us per layer and session, CPU time, {args.rounds * 10} passes interleaved")
    for label, medians in step_rows(rng, modules, args.rounds):
        ratio = f"  new/baseline {medians['new serial'] / medians['baseline serial']:.2f}x" if baseline else ""
        print(f"{label:52s}" + "".join(f"{name} {value:7.2f}   " for name, value in medians.items()) + ratio)


if __name__ == "__main__":
    main()
