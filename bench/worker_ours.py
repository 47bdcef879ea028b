"""One measurement run of edge_slm_node's engine; prints one JSON line. Driven by bench_speed.py.

    .venv/bin/python bench/worker_ours.py [THREADS] [--model PATH] [--mode full|decode] [--decode-tokens N]

--mode decode measures only the single-session decode (the busy row). A model the engine cannot
run (a quant type without kernels, an unknown architecture) prints {"unsupported": "..."}."""
import argparse
import json
import os
import resource
import sys
import time

STARTED = time.monotonic()
sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__file__), ".."))

from edge_slm_node.engine.config import EngineConfig          # noqa: E402
from edge_slm_node.engine.config_files import default_system_prompt   # noqa: E402
from edge_slm_node.engine.engine import Engine                # noqa: E402
from edge_slm_node.engine.sampling import SamplingParams      # noqa: E402
from edge_slm_node.kernels.quants import UnsupportedQuantError  # noqa: E402
from edge_slm_node.model.gguf_file import GGUFError           # noqa: E402

from common import COMMAND_16, DECODE_TOKENS, long_prompt      # noqa: E402


def faults():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt + usage.ru_majflt


def run_one(engine, session_id, text, params, raw=False):
    request = engine.submit(session_id, text, params, raw=raw)
    while not request.done:
        engine.step()
    return request


def run_together(engine, turns, params, raw=False):
    """Submit (session, text) turns at once and step until all are done."""
    batch = [engine.submit(session_id, text, params, raw=raw) for session_id, text in turns]
    while not all(r.done for r in batch):
        engine.step()
    return batch


# Wall-clock figures, as a user of the engine sees them (and as worker_llama.py times its loop):
# from a request's first token to its last, so each step's scheduling, sampling, detokenizing and
# KV bookkeeping count too. The engine's own Request.decode_seconds / prefill_seconds time only the
# forward passes; those figures are kept as *_forward_* for comparison.
def decode_wall_tps(request):
    return request.decode_steps / (request.finished_at - request.first_token_at)


def prefill_wall_tps(request):
    """New prompt tokens / (submit -> first token): tokenizing, scheduling and the sampled token included."""
    return (len(request.prompt_ids) - request.cached_prompt_tokens) / (request.first_token_at - request.submitted_at)


def batch_figures(batch):
    """-> (aggregate decode tokens/s over the window from the first first token to the last finish,
    mean per-session wall ms per decoded token, the same two from forward time only)."""
    window = max(r.finished_at for r in batch) - min(r.first_token_at for r in batch)
    aggregate = sum(r.decode_steps for r in batch) / window
    per_session_ms = 1000.0 * sum(1.0 / decode_wall_tps(r) for r in batch) / len(batch)
    aggregate_forward = sum(r.decode_steps for r in batch) / sum(r.decode_seconds for r in batch) * len(batch) \
        if all(r.decode_seconds for r in batch) else 0.0
    per_session_forward_ms = 1000.0 * sum(r.decode_seconds / r.decode_steps for r in batch) / len(batch)
    return aggregate, per_session_ms, aggregate_forward, per_session_forward_ms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("threads", type=int, nargs="?", default=2)
    parser.add_argument("--model", default="", help="a GGUF path or a known model name (default: SmolLM2)")
    parser.add_argument("--mode", choices=("full", "decode"), default="full")
    parser.add_argument("--decode-tokens", type=int, default=DECODE_TOKENS)
    args = parser.parse_args()
    threads, decode_tokens = args.threads, args.decode_tokens
    try:
        engine = Engine(EngineConfig(model_path=args.model, kv_pool_mb=96, max_context_tokens=1024,
                                     num_threads=threads,
                                     system_prompt=default_system_prompt() if args.mode == "full" else None))
    except (UnsupportedQuantError, GGUFError) as error:
        print(json.dumps({"unsupported": str(error)}))
        return
    startup_s = time.monotonic() - STARTED
    decode = SamplingParams(max_new_tokens=decode_tokens, ignore_eos=True)
    if args.mode == "decode":                          # the busy row: warm-up, then one decode
        engine.create_session("warm", system_prompt="")
        run_one(engine, "warm", "Explain what G00 does.", decode, raw=True)
        engine.destroy_session("warm")
        engine.create_session("decode", system_prompt="")
        single = run_one(engine, "decode", "Explain what G01 does.", decode, raw=True)
        print(json.dumps({"startup_s": startup_s, "decode_tps": decode_wall_tps(single),
                          "decode_forward_tps": single.decode_tokens_per_s, "threads": threads,
                          "environment": sorted(os.environ), "loadavg_end": os.getloadavg()}))
        return
    # warm-up (JIT already cached on disk): every code path once, and one answer as long as the
    # measured ones, so Python's heap has grown to its steady size before faults are counted
    engine.create_session("warm")
    run_one(engine, "warm", COMMAND_16, SamplingParams(max_new_tokens=4, ignore_eos=True))
    engine.destroy_session("warm")
    engine.create_session("warm", system_prompt="")
    run_one(engine, "warm", "Explain what G00 does.", decode, raw=True)
    engine.destroy_session("warm")

    engine.create_session("ttft")
    shared = run_one(engine, "ttft", COMMAND_16, SamplingParams(max_new_tokens=1))
    engine.destroy_session("ttft")

    engine.create_session("decode", system_prompt="")
    before = faults()
    single = run_one(engine, "decode", "Explain what G01 does.", decode, raw=True)
    faults_per_token = (faults() - before) / max(single.decode_steps, 1)
    engine.destroy_session("decode")

    engine.create_session("prefill", system_prompt="")
    prefill = run_one(engine, "prefill", long_prompt(engine.tokenizer), SamplingParams(max_new_tokens=1), raw=True)
    engine.destroy_session("prefill")

    names = [f"s{i}" for i in range(4)]
    for name in names:
        engine.create_session(name, system_prompt="")
    started = time.monotonic()
    batch = run_together(engine, [(name, f"Describe alarm {100 + i} on a CNC mill.") for i, name in enumerate(names)],
                         decode, raw=True)
    wall = time.monotonic() - started
    aggregate, per_session_ms, aggregate_forward, per_session_forward_ms = batch_figures(batch)

    # as deployed: sessions on the shared CNC system prompt (context ~300-430 while decoding)
    engine.create_session("cnc")
    cnc = run_one(engine, "cnc", COMMAND_16, decode)
    engine.destroy_session("cnc")
    names = [f"c{i}" for i in range(4)]
    for name in names:
        engine.create_session(name)
    cnc_batch = run_together(engine, [(name, COMMAND_16.replace("Spindle 2", f"Spindle {i + 1}"))
                                      for i, name in enumerate(names)], decode)
    aggregate_cnc, per_session_cnc_ms, _, _ = batch_figures(cnc_batch)

    cold_engine = Engine(EngineConfig(kv_pool_mb=32, max_context_tokens=1024, num_threads=threads,
                                      system_prompt=None, enable_prefix_cache=False), model=engine.model)
    cold_engine.create_session("cold", system_prompt=default_system_prompt())
    cold = run_one(cold_engine, "cold", COMMAND_16, SamplingParams(max_new_tokens=1))
    print(json.dumps({
        "startup_s": startup_s,
        "decode_tps": decode_wall_tps(single),
        "decode_forward_tps": single.decode_tokens_per_s,
        "prefill_tps": prefill_wall_tps(prefill),
        "prefill_forward_tps": (len(prefill.prompt_ids) - prefill.cached_prompt_tokens) / prefill.prefill_seconds,
        "prefill_tokens": len(prefill.prompt_ids),
        "ttft_shared_ms": shared.ttft_ms,
        "ttft_cold_ms": cold.ttft_ms,
        "ttft_prompt_tokens": len(shared.prompt_ids),
        "aggregate4_tps": aggregate,
        "aggregate4_forward_tps": aggregate_forward,
        "aggregate4_with_prefill_tps": sum(r.decode_steps for r in batch) / wall,
        "per_session4_ms": per_session_ms,
        "single_ms": 1000.0 / decode_wall_tps(single),
        "per_session4_forward_ms": per_session_forward_ms,
        "single_forward_ms": 1000.0 / single.decode_tokens_per_s,
        "decode_cnc_tps": decode_wall_tps(cnc),
        "cnc_context": len(cnc.prompt_ids) + cnc.decode_steps + 1,
        "aggregate4_cnc_tps": aggregate_cnc,
        "per_session4_cnc_ms": per_session_cnc_ms,
        "single_cnc_ms": 1000.0 / decode_wall_tps(cnc),
        "faults_per_token": faults_per_token,
        "threads": threads,
        "environment": sorted(os.environ),
        "loadavg_end": os.getloadavg(),
    }))


if __name__ == "__main__":
    main()
