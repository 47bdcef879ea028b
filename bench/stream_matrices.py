"""Decode-step matmuls per matrix kind, weights streamed from memory: GB/s of each kind's kernel.

    python bench/stream_matrices.py [--model PATH_OR_NAME] [--rounds 9] [--tokens 1] [--members 1]

For each kind (q, k, v, o, gate, up, down, and the output head) the matrices of every layer are
run one after the other for one token (--tokens 4: four, each its own llama.cpp call, as in a
decode step of 4 sessions; matmul_serial on this thread), so a kind's weights
stream from memory as in a real decode step (a layer's matrices each fit the L3; a kind's
28 together do not, except the smallest). Timed by this thread's CPU time (steadier on a
shared VM), median over rounds after the first, kinds alternating within a round. Compare
with bench_matmul.py's rows for one matrix (its weights stay cache-resident between calls)
and bench_bandwidth.py (what one thread can read) to tell a kernel that computes too slowly
from one that does not overlap its loads with its work. --members N: N threads run each pass
at once, each its share of every matrix's rows, as a decode step's team does (wall time of the
slowest member, per pass).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_matmul import call_of  # noqa: E402  (x, scratch and output of one matrix)
from edge_slm_node.model.loader import load_model  # noqa: E402

KINDS = ("q", "k", "v", "o", "gate", "up", "down")


def serial_pass(matrices, tokens, rng, team=(0, 1)):
    """A function running each matrix once on its own random tokens (matmul_serial; team: (member,
    members), that member's share of the rows), in order."""
    calls = [call_of(matrix, tokens, False, rng, rows_alone=True, team=team)[0] for matrix in matrices]

    def run():
        for call in calls:
            call()
    return run


def one_thread(kinds, tokens, rounds, rng) -> dict:
    """Each kind's pass on this thread, kinds alternating within a round -> CPU seconds per kind."""
    passes = {kind: serial_pass(matrices, tokens, rng) for kind, matrices in kinds.items()}
    samples = {kind: [] for kind in kinds}
    for _ in range(rounds):
        for kind, run in passes.items():
            started = time.thread_time()
            run()
            samples[kind].append(time.thread_time() - started)
    return samples


def team_of(members, kinds, tokens, rounds, rng) -> dict:
    """Each kind's pass run by `members` threads at once, each its share of the rows (the kernels
    release the GIL) -> wall seconds per kind, from all starting to the last finishing."""
    passes = [{kind: serial_pass(matrices, tokens, rng, (member, members)) for kind, matrices in kinds.items()}
              for member in range(members)]
    start, finish = threading.Barrier(members + 1), threading.Barrier(members + 1)

    def member_loop(own):
        for _ in range(rounds):
            for kind in kinds:
                start.wait()
                own[kind]()
                finish.wait()
    threads = [threading.Thread(target=member_loop, args=(own,), daemon=True) for own in passes]
    for thread in threads:
        thread.start()
    samples = {kind: [] for kind in kinds}
    for _ in range(rounds):
        for kind in kinds:
            start.wait()
            started = time.perf_counter()
            finish.wait()
            samples[kind].append(time.perf_counter() - started)
    for thread in threads:
        thread.join()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--members", type=int, default=1, help="threads sharing each matrix's rows")
    args = parser.parse_args()
    model = load_model(args.model)
    rng = np.random.default_rng(0)
    kinds = {kind: [getattr(layer, kind) for layer in model.weights.layers] for kind in KINDS}
    kinds["head"] = [model.weights.output]
    if args.members == 1:
        samples = one_thread(kinds, args.tokens, args.rounds, rng)
    else:
        samples = team_of(args.members, kinds, args.tokens, args.rounds, rng)
    clock = "CPU time" if args.members == 1 else f"wall time, {args.members} members"
    print(f"{model.path}, {args.tokens} token(s) a call, {clock}, load average {os.getloadavg()[0]:.1f}")
    print(f"{'kind':<6} {'types':<12} {'calls':>5} {'MB':>8} {'ms':>8} {'GB/s':>6} {'us/call':>9}")
    total_bytes = total_seconds = 0.0
    for kind, matrices in kinds.items():
        seconds = statistics.median(samples[kind][1:] or samples[kind])
        nbytes = sum(m.nbytes for m in matrices)
        types = ",".join(sorted({m.quant.name for m in matrices}))
        total_bytes, total_seconds = total_bytes + nbytes, total_seconds + seconds
        print(f"{kind:<6} {types:<12} {len(matrices):>5} {nbytes / 1e6:>8.1f} {seconds * 1e3:>8.2f} "
              f"{nbytes / seconds / 1e9:>6.1f} {seconds / len(matrices) * 1e6:>9.1f}")
    print(f"{'all':<6} {'':<12} {'':>5} {total_bytes / 1e6:>8.1f} {total_seconds * 1e3:>8.2f} "
          f"{total_bytes / total_seconds / 1e9:>6.1f}")


if __name__ == "__main__":
    main()
