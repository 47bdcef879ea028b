"""Where one decoded token's time goes: wraps the transformer's kernels with timers.

    .venv/bin/python bench/profile_decode.py [--sessions 1] [--tokens 64] [--threads 2] [--way pool|one_thread|split] [--per-kernel]

Runs the real engine (bundled model, no system prompt) with `--sessions` sessions decoding at
once and prints milliseconds per decode step by part; "python + scheduler" is the step's wall
time minus everything timed inside it. Timers add ~1 us per call. Only the Python layer loop
can be timed kernel by kernel, so by default every step runs that way on the thread pool
(--way pool); --way one_thread / split time what the engine normally runs (layers in one
kernel call: "layers" is then one entry; with split the parts overlap and sum both threads), and
with --per-kernel the same single-threaded kernels called one by one from Python.
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
from edge_slm_node.engine.decode_policy import DecodeWay    # noqa: E402
from edge_slm_node.engine.engine import Engine              # noqa: E402
from edge_slm_node.engine.sampling import SamplingParams, Sampler    # noqa: E402
from edge_slm_node.model import linear, serial_layers, transformer    # noqa: E402

totals = defaultdict(float)


def timed(label_of, function):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            totals[label_of(*args)] += time.perf_counter() - started
    return wrapper


def linear_label(self, *_):
    names = [p.name for p in self.parts] if hasattr(self, "parts") else [self.name]
    kind = "|".join(n.split(".")[-2] if n.endswith(".weight") else n for n in names)
    return "matmul " + ("output head" if kind.startswith("output") else kind)


class TimedOps:
    """Stands in for the kernels.ops module inside transformer.py, timing each call."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        return timed(lambda *_: "elementwise " + name, getattr(self._module, name))


def instrument():
    transformer.ops = TimedOps(transformer.ops)
    transformer.paged_attention = timed(lambda *_: "attention", transformer.paged_attention)
    transformer.write_kv = timed(lambda *_: "kv write", transformer.write_kv)
    serial_layers.SerialLayers.run = timed(lambda *_: "layers (one kernel call)", serial_layers.SerialLayers.run)
    transformer.Transformer.embed = timed(lambda *_: "embedding", transformer.Transformer.embed)
    linear.PreparedInput.prepare = timed(lambda *_: "activation quantize", linear.PreparedInput.prepare)
    linear.QuantizedLinear.apply = timed(linear_label, linear.QuantizedLinear.apply)
    linear.FusedLinear.apply = timed(linear_label, linear.FusedLinear.apply)
    Sampler.sample = timed(lambda *_: "sampling", Sampler.sample)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--way", default="pool", choices=[w.name.lower() for w in DecodeWay])
    parser.add_argument("--per-kernel", action="store_true",
                        help="one thread / split: run the layers as the Python loop of the same single-threaded "
                             "kernels, so each is timed (adds the loop's Python overhead)")
    args = parser.parse_args()
    engine = Engine(EngineConfig(kv_pool_mb=64, max_context_tokens=1024, num_threads=args.threads,
                                 system_prompt=None))
    engine.scheduler.decode_policy.forced = DecodeWay[args.way.upper()]
    if args.per_kernel:
        for forward in [engine.transformer] + [side.transformer for side in engine.sides]:
            forward.serial_layers = None
    params = SamplingParams(max_new_tokens=args.tokens, ignore_eos=True)
    names = [f"s{i}" for i in range(args.sessions)]
    for name in names:
        engine.create_session(name)
    timed_decode_steps(engine, names, params)                          # warm-up
    steps = timed_decode_steps(engine, names, params, before_timing=lambda: (instrument(), totals.clear()))
    count = len(steps)
    wall = sum(steps)
    print(f"{count} decode steps, {args.sessions} session(s), {args.threads} threads: "
          f"{1000 * wall / count:.2f} ms/step mean, {1000 * statistics.median(steps):.2f} median")
    for label, seconds in sorted(totals.items(), key=lambda item: -item[1]):
        print(f"  {label:36s} {1000 * seconds / count:7.3f} ms")
    print(f"  {'python + scheduler':36s} {1000 * (wall - sum(totals.values())) / count:7.3f} ms")


if __name__ == "__main__":
    main()
