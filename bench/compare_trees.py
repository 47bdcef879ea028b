"""Before/after a change: bench/worker_ours.py from two checkouts, alternating fresh processes.

    .venv/bin/python bench/compare_trees.py BEFORE_TREE AFTER_TREE [--runs 5] [--threads 2]

(e.g. `git worktree add /tmp/before <rev>` for BEFORE_TREE). Prints each figure's median per
tree and after/before; every run's figures go to bench/results/compare_trees.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIGURES = ["decode_tps", "prefill_tps", "aggregate4_tps", "per_session4_ms", "ttft_shared_ms", "ttft_cold_ms",
           "startup_s", "decode_cnc_tps", "aggregate4_cnc_tps", "faults_per_token"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    trees = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    results = {name: [] for name in trees}
    for run in range(args.runs):
        for name, tree in trees.items():
            out = subprocess.run([sys.executable, os.path.join(tree, "bench", "worker_ours.py"), str(args.threads)],
                                 capture_output=True, text=True, cwd=tree)
            if out.returncode:
                sys.exit(f"{name} run {run} failed:\n{out.stderr[-2000:]}")
            results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"{name} run {run}: decode {results[name][-1]['decode_tps']:.1f} tok/s", file=sys.stderr, flush=True)
    with open(os.path.join(HERE, "results", "compare_trees.json"), "w") as f:
        json.dump({"trees": trees, "runs": results}, f, indent=1)
    print(f"{'figure':20s} {'before':>10s} {'after':>10s} {'after/before':>12s}   (medians of {args.runs} alternating runs)")
    for key in FIGURES:
        before = statistics.median(r[key] for r in results["before"])
        after = statistics.median(r[key] for r in results["after"])
        print(f"{key:20s} {before:10.2f} {after:10.2f} {after / before if before else float('nan'):12.3f}")


if __name__ == "__main__":
    main()
