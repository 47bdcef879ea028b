"""KV memory for 1..16 concurrent sessions, each the CNC system prompt + one short exchange:
naive contiguous preallocation vs paged vs paged with the shared prompt. Figures come from the
engine's own block accounting after really running the exchanges.

    .venv/bin/python bench/bench_kv_memory.py [--plot bench/results/kv_memory.png]
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from edge_slm_node.engine.config import EngineConfig          # noqa: E402
from edge_slm_node.engine.config_files import default_system_prompt   # noqa: E402
from edge_slm_node.engine.engine import Engine                # noqa: E402
from edge_slm_node.engine.sampling import SamplingParams      # noqa: E402
from edge_slm_node.model.loader import load_model             # noqa: E402

from common import COMMAND_16                                  # noqa: E402

SESSION_COUNTS = (1, 2, 4, 8, 16)
MAX_CONTEXT = 2048
ANSWER_TOKENS = 24
MIB = 2**20


def used_kv_bytes(model, sessions: int, shared: bool) -> int:
    prompt = default_system_prompt()
    engine = Engine(EngineConfig(kv_pool_mb=400, max_context_tokens=MAX_CONTEXT, max_sessions=sessions,
                                 system_prompt=prompt if shared else None, enable_prefix_cache=shared,
                                 max_running=min(8, sessions), queue_timeout_s=3600), model=model)
    requests = []
    for index in range(sessions):
        session_id = f"s{index}"
        engine.create_session(session_id, system_prompt=None if shared else prompt)
        requests.append(engine.submit(session_id, f"{COMMAND_16} (station {index})",
                                      SamplingParams(max_new_tokens=ANSWER_TOKENS, ignore_eos=True)))
    while not all(r.done for r in requests):
        engine.step()
    failed = [r.error for r in requests if r.finish_reason.value != "length"]
    if failed:
        sys.exit(f"{len(failed)} of {sessions} exchanges did not complete: {failed[0]}")
    stats = engine.stats()
    return stats.used_blocks * stats.bytes_per_block, stats.bytes_per_token


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--plot", default=os.path.join(HERE, "results", "kv_memory.png"))
    args = parser.parse_args()
    model = load_model()
    rows = []
    for sessions in SESSION_COUNTS:
        paged, per_token = used_kv_bytes(model, sessions, shared=False)
        shared, _ = used_kv_bytes(model, sessions, shared=True)
        naive = sessions * MAX_CONTEXT * per_token
        rows.append((sessions, naive, paged, shared))
        print(f"{sessions:3d} sessions: contiguous {naive / MIB:8.1f} MiB   paged {paged / MIB:7.2f} MiB   "
              f"paged+shared {shared / MIB:7.2f} MiB", flush=True)
    print(f"(contiguous = {MAX_CONTEXT} tokens x {per_token} B per session; paged figures are the engine's "
          f"used blocks after a system prompt + {ANSWER_TOKENS}-token answer per session)")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(os.path.dirname(args.plot), exist_ok=True)
    figure, axis = plt.subplots(figsize=(7, 4.2))
    xs = [r[0] for r in rows]
    for index, label in ((1, f"contiguous, {MAX_CONTEXT} tokens/session"), (2, "paged"),
                         (3, "paged + shared CNC prompt")):
        axis.plot(xs, [r[index] / MIB for r in rows], marker="o", label=label)
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xticks(xs, [str(x) for x in xs])
    axis.set_xlabel("concurrent sessions")
    axis.set_ylabel("KV memory (MiB, log)")
    axis.set_title("SmolLM2-135M KV cache: CNC prompt + one short exchange per session")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(args.plot, dpi=110)
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
