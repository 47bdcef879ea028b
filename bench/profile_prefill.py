"""Where a prompt step's time goes: the real prefill, with and without its matmuls, and its parts alone.

    .venv/bin/python bench/profile_prefill.py [--model PATH_OR_NAME] [--tokens 256] [--rounds 5]
                                              [--threads 2] [--batch-tokens 128]

A prompt step is one GIL-free call (kernels/layers.py): its matmuls run on numba's pool, the
rest (norms, RoPE, KV writes, SwiGLU, residual adds, each matmul's activation quantization) on
the engine thread while the other pool threads wait, attention on the pool when big enough.
Rounds alternate two engines' worth of variants of the same cold prompt (its KV not cached):
"full", and "no matmuls" (every matmul kernel replaced by one doing nothing; attention then runs
on stale q, k, v, which costs the same). Their difference is the matmuls in place; beside it, the
same parts timed alone at the step's shapes, summed over the layers: the matmuls on the pool, the
activation quantization, the elementwise work. Milliseconds per prompt, medians over rounds.
"""
import argparse
import os
import statistics
import sys
import time

import numba
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from common import long_prompt                                 # noqa: E402
from edge_slm_node.engine.config import EngineConfig            # noqa: E402
from edge_slm_node.engine.engine import Engine                  # noqa: E402
from edge_slm_node.engine.sampling import SamplingParams        # noqa: E402
from edge_slm_node.kernels import ops                           # noqa: E402
from edge_slm_node.kernels.quants.common import new_scratch     # noqa: E402
from edge_slm_node.kernels.quantize import quantize_rows_q8_k         # noqa: E402
from edge_slm_node.model.linear import FusedLinear              # noqa: E402
from skip_matmuls import skipping_table                         # noqa: E402


def prefill_ms(engine, text) -> float:
    """One cold prompt (a new session, no prefix cache hit) -> its forward passes' milliseconds."""
    engine.create_session("profile", system_prompt="")
    request = engine.submit("profile", text, SamplingParams(max_new_tokens=1), raw=True)
    while not request.done:
        engine.step()
    engine.destroy_session("profile")
    return request.prefill_seconds * 1e3


def median_ms(fn, rounds: int) -> float:
    fn()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e3


def parts_alone(engine, tokens: int, rounds: int) -> dict:
    """Layer 0's parts at a chunk of `tokens`, each timed alone, times the number of layers (ms)."""
    transformer = engine.runner.transformer
    c, layer = transformer.config, transformer.weights.layers[0]
    rng = np.random.default_rng(0)
    layers = c.num_layers
    times = {}

    def matmul(group, width):
        parts = group.parts if isinstance(group, FusedLinear) else [group]
        x = rng.standard_normal((tokens, width)).astype(np.float32)
        scratch = new_scratch(tokens, width, {s for p in parts for s in p.scratch_slots})
        outs = [np.zeros((tokens, p.out_features), np.float32) for p in parts]
        if isinstance(group, FusedLinear):
            return lambda: group.apply(x, scratch, outs, True)
        return lambda: group.apply(x, scratch, outs[0], True)

    matmuls = [(transformer.qkv[0], c.hidden_size), (layer.o, c.q_size), (transformer.gate_up[0], c.hidden_size),
               (layer.down, c.intermediate_size)]
    times["matmuls on the pool (activation quantization included)"] = \
        layers * sum(median_ms(matmul(g, w), rounds) for g, w in matmuls)
    quantize = 0.0
    for width in (c.hidden_size, c.q_size, c.hidden_size, c.intermediate_size):
        x = rng.standard_normal((tokens, width)).astype(np.float32)
        xq, xd = np.zeros((tokens, width), np.int8), np.zeros((tokens, width // 256), np.float32)
        sums = np.zeros((tokens, width // 16), np.int32)
        quantize += median_ms(lambda: quantize_rows_q8_k(x, xq, xd, sums), rounds)
    times["  of which activation quantization (Q8_K, serial)"] = layers * quantize

    hidden = rng.standard_normal((tokens, c.hidden_size)).astype(np.float32)
    normed = np.empty_like(hidden)
    gate = rng.standard_normal((tokens, c.intermediate_size)).astype(np.float32)
    up = rng.standard_normal((tokens, c.intermediate_size)).astype(np.float32)
    q = rng.standard_normal((tokens, c.num_heads, c.head_dim)).astype(np.float32)
    k = rng.standard_normal((tokens, c.num_kv_heads, c.head_dim)).astype(np.float32)
    positions = np.arange(tokens, dtype=np.int32)
    cos, sin = ops.rope_tables(tokens, c.rotary_dims, c.rope_freq_base, None)
    avx512 = bool(transformer.consts.avx512)
    elementwise = {
        "rms_norm x2": lambda: (ops.rms_norm(hidden, layer.attn_norm, np.float32(1e-6), normed),
                                ops.rms_norm(hidden, layer.ffn_norm, np.float32(1e-6), normed)),
        "residual add x2": lambda: (ops.add_in_place(hidden, normed), ops.add_in_place(hidden, normed)),
        "rope q, k": lambda: (ops.apply_rope(q, positions, cos, sin, c.rope_neox),
                              ops.apply_rope(k, positions, cos, sin, c.rope_neox)),
        "silu_mul": lambda: ops.silu_mul(gate, up, gate, avx512),
    }
    for name, fn in elementwise.items():
        times[f"elementwise: {name} (serial)"] = layers * median_ms(fn, rounds)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-tokens", type=int, default=128, help="max_batch_tokens: tokens per prompt step")
    args = parser.parse_args()
    engine = Engine(EngineConfig(model_path=args.model, kv_pool_mb=64, max_context_tokens=1024,
                                 num_threads=args.threads, system_prompt=None, enable_prefix_cache=False,
                                 max_batch_tokens=args.batch_tokens))
    numba.set_num_threads(args.threads)
    text = long_prompt(engine.tokenizer, args.tokens)
    transformer = engine.runner.transformer
    real = transformer.matmuls[True]
    skipped = skipping_table(real)
    variants = {"full": real, "no matmuls": skipped}
    samples = {name: [] for name in variants}
    for table in variants.values():            # warm-up: compile, touch
        transformer.matmuls[True] = table
        prefill_ms(engine, text)
    for _ in range(args.rounds):
        for name, table in variants.items():
            transformer.matmuls[True] = table
            samples[name].append(prefill_ms(engine, text))
    transformer.matmuls[True] = real
    full, bare = (statistics.median(samples[n]) for n in variants)
    chunk = min(args.tokens, args.batch_tokens)
    print(f"model {args.model or 'default'}, {args.tokens}-token prompt in steps of {chunk}, "
          f"{args.threads} threads, {args.rounds} rounds")
    print(f"{'prefill, full':<60} {full:>9.1f} ms  ({args.tokens / full * 1e3:.1f} tok/s; runs "
          + ", ".join(f"{s:.0f}" for s in samples['full']) + ")")
    print(f"{'prefill, no matmuls':<60} {bare:>9.1f} ms  (runs " + ", ".join(f"{s:.0f}" for s in samples['no matmuls'])
          + ")")
    print(f"{'matmuls in place (full - no matmuls)':<60} {full - bare:>9.1f} ms")
    steps = -(-args.tokens // chunk)
    alone = parts_alone(engine, chunk, args.rounds)
    for name, ms in alone.items():
        print(f"{name + ' alone':<60} {ms * steps:>9.1f} ms")
    engine.close()


if __name__ == "__main__":
    main()
