"""What guard_zones costs: decode step time with the canary checks off and on, interleaved.

    .venv/bin/python bench/bench_guard_zones.py [--rounds 5] [--tokens 48]

Two engines on the same model (SmolLM2 by default), one with guard_zones; each round times a
decode of 1 and of 4 sessions on each. Prints median ms per step and the on / off ratio.
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
from edge_slm_node.model.loader import load_model  # noqa: E402

SESSIONS = (1, 4)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--model", default="")
    args = parser.parse_args()
    model = load_model(args.model)
    engines = {guarded: Engine(EngineConfig(kv_pool_mb=64, max_context_tokens=1024, system_prompt=None,
                                            guard_zones=guarded), model=model) for guarded in (False, True)}
    params = SamplingParams(max_new_tokens=args.tokens, ignore_eos=True)
    for engine in engines.values():
        for i in range(max(SESSIONS)):
            engine.create_session(f"s{i}")
        timed_decode_steps(engine, ["s0"], SamplingParams(max_new_tokens=8, ignore_eos=True))     # warm-up
    times = {(g, n): [] for g in engines for n in SESSIONS}
    for _ in range(args.rounds):
        for guarded, engine in engines.items():
            for n in SESSIONS:
                steps = timed_decode_steps(engine, [f"s{i}" for i in range(n)], params)
                times[(guarded, n)].append(1000 * statistics.median(steps))
    guards = engines[True]
    print(f"median ms per decode step, {args.rounds} interleaved rounds of {args.tokens} tokens; guard zones: "
          f"{guards.guards.count} buffers, {guards.arena.storage.nbytes - guards.arena.num_bytes} bytes of KV guard rows")
    for n in SESSIONS:
        off, on = (statistics.median(times[(g, n)]) for g in (False, True))
        print(f"  {n} session(s): off {off:6.2f}  on {on:6.2f}  on/off {on / off:.3f}")


if __name__ == "__main__":
    main()
