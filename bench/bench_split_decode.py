"""Decode step time with 1-4 sessions for each mode of running a decode step, interleaved in one process.

    .venv/bin/python bench/bench_split_decode.py [--rounds 6] [--tokens 48] [--busy] [--model NAME|PATH]

Modes (engine/decode_policy.py): "split" runs 2+ sessions as num_threads parts side by side, each
part's layers in one kernel call; "team" runs one forward on num_threads threads that split each
matmul's rows and meet at barriers; "one thread" runs them all on the engine thread, layers in one
call; "thread pool" does too, with each big matmul on numba's thread pool. The engine normally picks per step from measured times (the "adaptive" row); here each mode
is also forced in turn (split with 1 session falls back to one thread). --busy keeps one other
process spinning on a core meanwhile.
Prints the median step ms over the rounds' medians and the 4-session / best 1-session ratio.
"""
import argparse
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from common import timed_decode_steps  # noqa: E402

from edge_slm_node.engine.config import EngineConfig  # noqa: E402
from edge_slm_node.engine.decode_policy import DecodeThreading  # noqa: E402
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
    parser.add_argument("--busy", action="store_true", help="one other process spinning on a core")
    parser.add_argument("--model", default="", help="a GGUF path or a known model name (default: SmolLM2)")
    args = parser.parse_args()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    engine = Engine(EngineConfig(model_path=args.model, kv_pool_mb=64, max_context_tokens=1024, num_threads=2,
                                 system_prompt=None))
    for i in range(max(SESSIONS)):
        engine.create_session(f"s{i}")
    variants = {"split": DecodeThreading.SPLIT, "team": DecodeThreading.TEAM, "one thread": DecodeThreading.ONE_THREAD,
                "thread pool": DecodeThreading.POOL, "adaptive": None}
    policy = engine.runner.decode_policy
    results = {(v, n): [] for v in variants for n in SESSIONS}
    for forced in variants.values():                          # warm-up
        policy.forced = forced
        median_step_ms(engine, max(SESSIONS), 8)
    for _ in range(args.rounds):
        for name, forced in variants.items():
            policy.forced = forced
            for n in SESSIONS:
                results[(name, n)].append(median_step_ms(engine, n, args.tokens))
    if busy is not None:
        busy.kill()
    print(f"median ms per decode step, {args.rounds} interleaved rounds of {args.tokens} tokens"
          + (", one other process busy" if busy else ""))
    best_single = min(statistics.median(results[(name, 1)]) for name in variants)
    for name in variants:
        medians = {n: statistics.median(results[(name, n)]) for n in SESSIONS}
        print(f"{name:12s}" + "".join(f"  {n} session(s) {medians[n]:6.2f}" for n in SESSIONS)
              + f"   4 / best 1: {medians[4] / best_single:.2f}x")


if __name__ == "__main__":
    main()
