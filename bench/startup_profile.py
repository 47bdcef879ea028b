"""Where an engine's start-up goes: every loading stage as it is logged (ms since start), then
the totals. With --prefix-kv-cache the shared prompt's KV comes from its cache file when one
matches (engine/prefix_kv_cache.py): run twice, the first run writes it.

    .venv/bin/python bench/startup_profile.py [--model NAME|PATH] [--prefix-kv-cache]
"""
import argparse
import logging
import os
import sys
import time

STARTED = time.monotonic()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from edge_slm_node.engine.config import EngineConfig  # noqa: E402
from edge_slm_node.engine.config_files import default_system_prompt  # noqa: E402
from edge_slm_node.engine.engine import Engine  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="")
    parser.add_argument("--prefix-kv-cache", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)8.0f ms  %(message)s")
    imported = time.monotonic() - STARTED
    begun = time.monotonic()
    Engine(EngineConfig(model_path=args.model, kv_pool_mb=96, max_context_tokens=1024,
                        system_prompt=default_system_prompt(), prefix_kv_cache=args.prefix_kv_cache))
    print(f"imports {imported:.2f} s, engine {time.monotonic() - begun:.2f} s, total {time.monotonic() - STARTED:.2f} s")


if __name__ == "__main__":
    main()
