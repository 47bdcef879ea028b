"""Decode step time with 1-4 sessions, split decode on and off, interleaved in one process.

    .venv/bin/python bench/bench_split_decode.py [--rounds 6] [--tokens 48]

Split decode (engine/scheduler.py) runs a decode-only step of 2+ sessions as num_threads parts
side by side; "one batch" runs it with the kernels on numba's thread pool. The engine normally
picks per step from measured times (engine/split_policy.py, the "adaptive" row); here each way is
also forced in turn.
Prints the median step ms over the rounds' medians and the 4-session / 1-session ratio.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from common import timed_decode_steps  # noqa: E402

from edge_slm_node.engine.config import EngineConfig  # noqa: E402
from edge_slm_node.engine.engine import Engine  # noqa: E402
from edge_slm_node.engine.sampling import SamplingParams  # noqa: E402

SESSIONS = (1, 2, 3, 4)


def median_step_ms(engine, sessions: int, tokens: int) -> float:
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    return 1000 * statistics.median(timed_decode_steps(engine, [f"s{i}" for i in range(sessions)], params))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    engine = Engine(EngineConfig(kv_pool_mb=64, max_context_tokens=1024, num_threads=2, system_prompt=None))
    for i in range(max(SESSIONS)):
        engine.create_session(f"s{i}")
    variants = {"split": True, "one batch": False, "adaptive": None}
    policy = engine.scheduler.split_policy
    results = {(v, n): [] for v in variants for n in SESSIONS}
    for forced in variants.values():                          # warm-up
        policy.forced = forced
        median_step_ms(engine, max(SESSIONS), 8)
    for _ in range(args.rounds):
        for name, forced in variants.items():
            policy.forced = forced
            for n in SESSIONS:
                results[(name, n)].append(median_step_ms(engine, n, args.tokens))
    print(f"median ms per decode step, {args.rounds} interleaved rounds of {args.tokens} tokens")
    for name in variants:
        medians = {n: statistics.median(results[(name, n)]) for n in SESSIONS}
        print(f"{name:10s}" + "".join(f"  {n} session(s) {medians[n]:6.2f}" for n in SESSIONS)
              + f"   4 / 1: {medians[4] / medians[1]:.2f}x")


if __name__ == "__main__":
    main()
