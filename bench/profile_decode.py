"""Where one decoded token's time goes: timers around the forward pass's parts.

    .venv/bin/python bench/profile_decode.py [--model PATH_OR_NAME] [--sessions 1] [--tokens 64]
                                             [--threads 2] [--mode one_thread|split|team|pool]
                                             [--no-matmuls]

Runs the real engine (no system prompt) with `--sessions` sessions decoding at once and prints
milliseconds per decode step by part: embedding, the layers (kernels/layers.py, one GIL-free
call: its matmuls, attention and elementwise work together; bench/bench_matmul.py and
bench/bench_attention.py time those kernels alone), the output head, sampling, and
"python + scheduler" (the step's wall time minus everything timed). Timers add ~1 us per call;
with --mode split the parts of both threads overlap and are summed. --no-matmuls runs every
matmul kernel as one doing nothing (bench/skip_matmuls.py): what the step costs besides them.
"""
import argparse
import os
import statistics
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from common import timed_decode_steps                       # noqa: E402
from edge_slm_node.engine.config import EngineConfig        # noqa: E402
from edge_slm_node.engine.decode_policy import DecodeThreading    # noqa: E402
from edge_slm_node.engine.engine import Engine              # noqa: E402
from edge_slm_node.engine.sampling import SamplingParams, Sampler    # noqa: E402
from edge_slm_node.model import linear, transformer          # noqa: E402
from skip_matmuls import skipping_table                      # noqa: E402

totals = defaultdict(float)


def timed(label, function):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            totals[label] += time.perf_counter() - started
    return wrapper


def instrument():
    transformer.decoder_layers = timed("layers (one kernel call)", transformer.decoder_layers)
    transformer.Transformer.embed = timed("embedding", transformer.Transformer.embed)
    linear.Linear.apply = timed("output head", linear.Linear.apply)
    Sampler.sample = timed("sampling", Sampler.sample)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="")
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mode", default="one_thread", choices=[w.name.lower() for w in DecodeThreading])
    parser.add_argument("--no-matmuls", action="store_true", help="every matmul a kernel doing nothing")
    args = parser.parse_args()
    engine = Engine(EngineConfig(model_path=args.model, kv_pool_mb=64, max_context_tokens=1024,
                                 num_threads=args.threads, system_prompt=None))
    engine.runner.decode_policy.forced = DecodeThreading[args.mode.upper()]
    if args.no_matmuls:
        for model in [engine.runner.transformer] + [side.transformer for side in engine.runner.sides]:
            model.matmuls = {threads: skipping_table(table) for threads, table in model.matmuls.items()}
    params = SamplingParams(max_new_tokens=args.tokens, ignore_eos=True)
    names = [f"s{i}" for i in range(args.sessions)]
    for name in names:
        engine.create_session(name)
    timed_decode_steps(engine, names, params)                          # warm-up
    steps = timed_decode_steps(engine, names, params, before_timing=lambda: (instrument(), totals.clear()))
    count = len(steps)
    wall = sum(steps)
    mode = args.mode + (", no matmuls" if args.no_matmuls else "")
    print(f"{engine.model.path}\n{count} decode steps, {args.sessions} session(s), {args.threads} threads, "
          f"mode {mode}: {1000 * wall / count:.2f} ms/step mean, {1000 * statistics.median(steps):.2f} median")
    for label, seconds in sorted(totals.items(), key=lambda item: -item[1]):
        print(f"  {label:36s} {1000 * seconds / count:7.3f} ms")
    print(f"  {'python + scheduler':36s} {1000 * (wall - sum(totals.values())) / count:7.3f} ms")


if __name__ == "__main__":
    main()
