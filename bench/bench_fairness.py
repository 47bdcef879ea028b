"""First-token time of an operator's short command while the node is busy with long answers.

    .venv/bin/python bench/bench_fairness.py [--long 8] [--queued 16] [--long-tokens 2048] [--runs 3]
                                             [--max-batch-tokens 128]

`--long` sessions decode `--long-tokens` tokens each on the shared CNC prompt, `--queued` more
long commands wait behind them, then one 16-token operator command arrives; the figure is the
operator's time to first token (and to its last token), with the engine configured as
config/edge_slm.yaml ships it. Run with --fair-share-steps 100000 to see the engine without
round-robin decode slots (the "before" figure).
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge_slm_node.engine.config import EngineConfig               # noqa: E402
from edge_slm_node.engine.config_files import default_system_prompt  # noqa: E402
from edge_slm_node.engine.engine import Engine                     # noqa: E402
from edge_slm_node.engine.sampling import SamplingParams           # noqa: E402

from common import COMMAND_16                                      # noqa: E402


def one_run(engine, args) -> dict:
    long_params = SamplingParams(max_new_tokens=args.long_tokens, ignore_eos=True)
    busy = [engine.submit(f"long-{i}", f"Describe maintenance step {i} of a CNC mill in detail.", long_params,
                          create_if_missing=True) for i in range(args.long)]
    while not all(r.generated_ids for r in busy):                   # all decoding
        engine.step()
    for _ in range(20):
        engine.step()
    waiting = [engine.submit(f"queued-{i}", f"Explain alarm {200 + i} in detail.", long_params,
                             create_if_missing=True) for i in range(args.queued)]
    submitted = time.monotonic()
    operator = engine.submit("operator", COMMAND_16, SamplingParams(max_new_tokens=16, ignore_eos=True),
                             create_if_missing=True)
    while not operator.done:
        engine.step()
    figures = {"ttft_s": operator.first_token_at - submitted, "answer_s": operator.finished_at - submitted,
               "busy_tokens": sum(len(r.generated_ids) for r in busy + waiting),
               "suspensions": sum(r.suspensions for r in busy + waiting),
               "preemptions": engine.stats().preemptions}
    for name in list(engine.sessions):
        engine.destroy_session(name)
    return figures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--long", type=int, default=8)
    parser.add_argument("--queued", type=int, default=16)
    parser.add_argument("--long-tokens", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fair-share-steps", type=int, default=EngineConfig.fair_share_steps)
    parser.add_argument("--kv-pool-mb", type=float, default=64.0)
    parser.add_argument("--max-batch-tokens", type=int, default=EngineConfig.max_batch_tokens)
    args = parser.parse_args()
    engine = Engine(EngineConfig(kv_pool_mb=args.kv_pool_mb, max_context_tokens=2048, max_sessions=64,
                                 max_queued_requests=64, system_prompt=default_system_prompt(),
                                 fair_share_steps=args.fair_share_steps, queue_timeout_s=3600,
                                 max_batch_tokens=args.max_batch_tokens))
    runs = [one_run(engine, args) for _ in range(args.runs)]
    print(f"{args.long} sessions decoding {args.long_tokens}-token answers, {args.queued} queued, kv_pool_mb "
          f"{args.kv_pool_mb:g}, fair_share_steps {args.fair_share_steps}, max_batch_tokens "
          f"{args.max_batch_tokens}, {args.runs} runs")
    for key in ("ttft_s", "answer_s"):
        values = [r[key] for r in runs]
        print(f"  operator {key:9s} median {statistics.median(values):6.2f}  (runs {', '.join(f'{v:.2f}' for v in values)})")
    print(f"  suspensions per run {[r['suspensions'] for r in runs]}, preemptions so far {runs[-1]['preemptions']}")


if __name__ == "__main__":
    main()
