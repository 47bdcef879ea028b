"""Speed of edge_slm_node's engine vs llama.cpp on the same GGUF and threads, alternating runs.

    bash bench/setup_reference.sh            # once: llama-cpp-python in bench/.refvenv
    .venv/bin/python bench/bench_speed.py [--runs 5] [--threads 2]

Each run is a fresh process per side (so start-up is measured too); the table shows medians
(per-session rows: the median of each run's own ratio). Every run's figures go to
bench/results/speed_runs.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

ROWS = [  # key, label, ours key, llama key, target text, higher is better
    ("decode_tps", "decode tokens/s, 1 session", "decode_tps", "decode_tps", ">= 1.5x", True),
    ("prefill_tps", "prefill tokens/s, 256-token prompt, cold", "prefill_tps", "prefill_tps", ">= 1.0x", True),
    ("aggregate4_tps", "decode tokens/s, 4 sessions at once", "aggregate4_tps", "decode_tps", ">= 3x single", True),
    ("ttft_shared_ms", "first token ms, CNC prompt + command, shared", "ttft_shared_ms", "ttft_cold_ms",
     "<= 0.15x", False),
    ("ttft_cold_ms", "first token ms, CNC prompt + command, cold", "ttft_cold_ms", "ttft_cold_ms", "", False),
    ("startup_s", "start-up to ready, s (warm JIT cache)", "startup_s", "startup_s", "<= 5 s", False),
    ("decode_cnc_tps", "decode tokens/s, 1 session on the CNC prompt", "decode_cnc_tps", "decode_cnc_tps", "", True),
    ("aggregate4_cnc_tps", "decode tokens/s, 4 sessions on the CNC prompt", "aggregate4_cnc_tps", "decode_cnc_tps",
     "", True),
]


def reference_python():
    for candidate in (os.environ.get("EDGE_SLM_REFERENCE_PYTHON"), os.path.join(HERE, ".refvenv", "bin", "python"),
                      "/work/refvenv/bin/python"):
        if candidate and os.path.exists(candidate):
            return candidate
    sys.exit("no llama-cpp-python venv: run bash bench/setup_reference.sh")


def run(command):
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        sys.exit(f"{command[1]} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from edge_slm_node.engine.config_files import DEFAULT_SYSTEM_PROMPT_FILE, config_dir
    from edge_slm_node.model.loader import default_model_path
    model, prompt_file = default_model_path(), os.path.join(config_dir(), DEFAULT_SYSTEM_PROMPT_FILE)
    ours, llama = [], []
    for index in range(args.runs):
        ours.append(run([sys.executable, os.path.join(HERE, "worker_ours.py"), str(args.threads)]))
        llama.append(run([reference_python(), os.path.join(HERE, "worker_llama.py"), model, str(args.threads),
                          prompt_file]))
        print(f"run {index + 1}/{args.runs}: ours decode {ours[-1]['decode_tps']:.1f} tok/s, "
              f"llama.cpp {llama[-1]['decode_tps']:.1f} tok/s", file=sys.stderr)
    with open(os.path.join(HERE, "results", "speed_runs.json"), "w") as f:
        json.dump({"ours": ours, "llama_cpp": llama}, f, indent=1)
    median = lambda runs, key: statistics.median(r[key] for r in runs)
    print(f"SmolLM2-135M-Instruct Q4_1, {args.threads} threads, median of {args.runs} alternating runs, "
          f"llama-cpp-python {llama[0]['version']}")
    print(f"{'figure':48s} {'ours':>10s} {'llama.cpp':>10s} {'ratio':>7s}  target")
    for _, label, ours_key, llama_key, target, higher in ROWS:
        a, b = median(ours, ours_key), median(llama, llama_key)
        ratio = a / b if b else float("nan")
        print(f"{label:48s} {a:10.1f} {b:10.1f} {ratio:6.2f}x  {target}")
    # ratio of two figures of the same run (seconds apart in one process), median over runs: the
    # host's drift between runs cancels out
    for label, together, alone, target in [
            ("per-session ms/token with 4 at once vs alone", "per_session4_ms", "single_ms", "<= 1.5x"),
            ("the same, 4 sessions on the CNC prompt", "per_session4_cnc_ms", "single_cnc_ms", "")]:
        ratios = sorted(r[together] / r[alone] for r in ours)
        print(f"{label:48s} {median(ours, together):10.1f} {median(ours, alone):10.1f} "
              f"{statistics.median(ratios):6.2f}x  {target}  (ours alone; per-run ratios {ratios[0]:.2f}-{ratios[-1]:.2f})")
    print(f"{'page faults per decoded token (getrusage)':48s} {median(ours, 'faults_per_token'):10.3f} "
          f"{'':>10s} {'':>7s}  < 0.01")
    print(f"prompt tokens for the first-token rows: ours {ours[0]['ttft_prompt_tokens']}, "
          f"llama.cpp {llama[0]['ttft_prompt_tokens']}; CNC-prompt decoding ends at context {ours[0]['cnc_context']}")


if __name__ == "__main__":
    main()
