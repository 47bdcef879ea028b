"""What constrained decoding costs: mask time per token, its share of a decode step, and decode
tok/s constrained vs unconstrained, per model.

    .venv/bin/python bench/bench_constrained.py [--models "" qwen2.5-coder-0.5b-instruct-q4_k_m]
        [--rounds 3] [--sessions 1 4] [--json bench/results/constrained.json]

Modes, interleaved round by round on one engine per model (guard_zones off):
  free   unconstrained, ignore_eos, as many tokens as the json answers had on average
  json   the nested job schema of test/engine/test_constrained.py
  gcode  a G-code program grammar (Lark, up to 6 lines)
  tools  the milling cell's tools (lazy grammar: free text until a call); a second engine
Decode steps are timed from the outside (engine.step() wall time of steps that decode all the
round's sessions and run no prompt chunk), so the mask work done in postprocess is included; mask time is the constraint's own
(compute into the bitmask + apply to the logits row).
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "test", "engine"))

from test_constrained import JOB_SCHEMA  # noqa: E402

from edge_slm_node.engine.config import EngineConfig  # noqa: E402
from edge_slm_node.engine.engine import Engine  # noqa: E402
from edge_slm_node.engine.request import RequestState  # noqa: E402
from edge_slm_node.engine.sampling import SamplingParams  # noqa: E402
from edge_slm_node.engine.tools import read_tools_file  # noqa: E402
from edge_slm_node.model.loader import load_model  # noqa: E402

SYSTEM = "You are the assistant of CNC cell 3. Answer briefly."
GCODE_PROGRAM = r"""
start: line (line)~0..5
line: ("G0" | "G1") (" " AXIS NUM)~1..3 (" F" FEED)? "\n"
AXIS: "X" | "Y" | "Z"
NUM: /-?(0|[1-9][0-9]{0,3})(\.[0-9]{1,3})?/
FEED: /[1-9][0-9]{0,3}/
"""
JOBS = ["Plan a drilling job for the mill as JSON.", "Write the job ticket for lathe 1.",
        "Which operations does part 7 need?", "Job for shift B please."]
TEXTS = {"free": JOBS, "json": JOBS, "tools": ["Why does spindle 2 alarm?", "Shut off valve three.",
                                               "What is G01?", "Set the feed override to 80 percent."],
         "gcode": ["Write a G-code program that drills two holes.", "Move to X10 Y20.",
                   "Rapid to the tool change position.", "Feed the Z axis down 2 mm."]}


def params_for(mode: str, free_tokens: int) -> SamplingParams:
    """Greedy everywhere (the node's default): full-vocabulary sampling (top_k 0) sorts the whole
    logits row, a few ms at 49k tokens and faster when most of it is -inf, which would hide the
    masks' cost behind the sampler's."""
    if mode == "json":
        return SamplingParams(max_new_tokens=256, json_schema=json.dumps(JOB_SCHEMA))
    if mode == "gcode":
        return SamplingParams(max_new_tokens=256, grammar=GCODE_PROGRAM)
    if mode == "tools":
        return SamplingParams(max_new_tokens=256)
    return SamplingParams(max_new_tokens=free_tokens, ignore_eos=True)


def run_round(engine, mode: str, sessions: int, free_tokens: int) -> dict:
    """One request per session, all at once; -> decode steps' wall time, tokens, mask time."""
    names = [f"{mode}-{i}" for i in range(sessions)]
    for name in names:
        engine.create_session(name, keep_history=False)
    requests = [engine.submit(name, TEXTS[mode][i % len(TEXTS[mode])], params_for(mode, free_tokens))
                for i, name in enumerate(names)]
    step_seconds, step_tokens = [], 0
    while not all(r.done for r in requests):
        # timed: steps that decode every session's token and nothing else (a batch of `sessions`)
        decode_only = not engine.scheduler.queue and len(engine.scheduler.running) == sessions and all(
            r.state is RequestState.DECODE for r in engine.scheduler.running)
        decoded_before = sum(r.decode_steps for r in requests)
        started = time.perf_counter()
        engine.step()
        if decode_only:
            step_seconds.append(time.perf_counter() - started)
            step_tokens += sum(r.decode_steps for r in requests) - decoded_before
    for name in names:
        engine.destroy_session(name)
    constraints = [r.constraint for r in requests if r.constraint is not None]
    return {"steps": step_seconds, "tokens": step_tokens,
            "forward_seconds": statistics.mean(r.decode_seconds / r.decode_steps for r in requests if r.decode_steps),
            "answer_tokens": statistics.mean(len(r.generated_ids) for r in requests),
            "mask_seconds": sum(c.mask_seconds for c in constraints),
            "mask_calls": sum(c.mask_calls for c in constraints),
            "finish": sorted({r.finish_reason.value for r in requests})}


def summarize(rounds: list) -> dict:
    steps = [s for r in rounds for s in r["steps"]]
    tokens = sum(r["tokens"] for r in rounds)
    calls = sum(r["mask_calls"] for r in rounds)
    mask_us = 1e6 * sum(r["mask_seconds"] for r in rounds) / calls if calls else 0.0
    return {"decode_tok_s": tokens / sum(steps) if steps else 0.0,
            "step_ms_median": 1e3 * statistics.median(steps) if steps else 0.0,
            "step_ms_mean": 1e3 * statistics.mean(steps) if steps else 0.0,
            "forward_ms_mean": 1e3 * statistics.mean(r["forward_seconds"] for r in rounds),
            "mask_us_per_token": mask_us, "answer_tokens": statistics.mean(r["answer_tokens"] for r in rounds),
            "finish": sorted({f for r in rounds for f in r["finish"]}), "decode_steps": len(steps)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["", "qwen2.5-coder-0.5b-instruct-q4_k_m"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    tools = read_tools_file(os.path.join(ROOT, "config", "tools_milling_cell.yaml"))
    report = {"load_average": os.getloadavg(), "rounds": args.rounds, "results": []}
    for model_name in args.models:
        model = load_model(model_name)
        settings = dict(kv_pool_mb=48, max_context_tokens=1024, system_prompt=SYSTEM)
        engines = {"plain": Engine(EngineConfig(**settings), model=model),
                   "tools": Engine(EngineConfig(**settings, tools=tools), model=model)}
        for mode in ("free", "json", "gcode", "tools"):          # warm-up: kernels, llguidance tokenizer,
            for sessions in args.sessions:                        # the decode policy's first timings
                run_round(engines["tools" if mode == "tools" else "plain"], mode, sessions, 32)
        label = os.path.basename(model.path)
        for sessions in args.sessions:
            results = {mode: [] for mode in ("free", "json", "gcode", "tools")}
            free_tokens = 96
            for _ in range(args.rounds):
                for mode in results:
                    engine = engines["tools" if mode == "tools" else "plain"]
                    results[mode].append(run_round(engine, mode, sessions, free_tokens))
                free_tokens = max(16, round(statistics.mean(r["answer_tokens"] for r in results["json"])))
            summary = {mode: summarize(rounds) for mode, rounds in results.items()}
            free = summary["free"]
            for mode, row in summary.items():
                share = row["mask_us_per_token"] * 1e-6 * sessions / (row["step_ms_median"] * 1e-3) \
                    if row["step_ms_median"] else 0.0
                row.update(model=label, sessions=sessions, mode=mode, mask_share_of_step=share,
                           tok_s_vs_free=row["decode_tok_s"] / free["decode_tok_s"] if free["decode_tok_s"] else 0.0)
                report["results"].append(row)
                print(f"{label:48s} sessions {sessions}  {mode:5s}  decode {row['decode_tok_s']:6.1f} tok/s "
                      f"({row['tok_s_vs_free']:.2f}x free)  step {row['step_ms_median']:6.2f} ms (mean {row['step_ms_mean']:.2f}, "
                      f"forward {row['forward_ms_mean']:.2f})  "
                      f"mask {row['mask_us_per_token']:7.1f} us/token = {100 * share:4.1f} % of a step  "
                      f"answer {row['answer_tokens']:.0f} tokens {row['finish']}", flush=True)
        for engine in engines.values():
            engine.close()
    report["load_average_end"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()
