"""Resident memory of the engine after load, next to the GGUF size and the KV pool.

    .venv/bin/python bench/bench_memory.py [--kv-pool-mb 64] [--model PATH_OR_NAME]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from edge_slm_node.engine.memory import resident_bytes   # noqa: E402

MIB = 2**20


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kv-pool-mb", type=float, default=64.0)
    parser.add_argument("--model", default="", help="a GGUF path or a known model name (default: SmolLM2)")
    args = parser.parse_args()
    baseline = resident_bytes()
    from edge_slm_node.engine.config import EngineConfig
    from edge_slm_node.engine.config_files import default_system_prompt
    from edge_slm_node.engine.engine import Engine
    imported = resident_bytes()
    engine = Engine(EngineConfig(model_path=args.model, kv_pool_mb=args.kv_pool_mb,
                                 system_prompt=default_system_prompt()))
    loaded = resident_bytes()
    stats = engine.stats()
    gguf = os.path.getsize(engine.model.path)
    print(f"GGUF file                      {gguf / MIB:8.1f} MiB")
    print(f"weights as held (packed)       {stats.weights_bytes / MIB:8.1f} MiB")
    print(f"KV arena                       {stats.arena_bytes / MIB:8.1f} MiB ({stats.total_blocks} blocks x "
          f"{stats.bytes_per_block // 1024} KiB, {stats.bytes_per_token} B/token)")
    print(f"RSS: interpreter               {baseline / MIB:8.1f} MiB")
    print(f"RSS: + numpy/numba/tokenizers  {imported / MIB:8.1f} MiB")
    print(f"RSS: after load + CNC prefill  {loaded / MIB:8.1f} MiB")
    print(f"RSS after load - imports - KV arena = {(loaded - imported - stats.arena_bytes) / MIB:.1f} MiB "
          f"(weights, JIT code, buffers) vs GGUF {gguf / MIB:.1f} MiB")


if __name__ == "__main__":
    main()
