"""Speed of edge_slm_node's engine vs llama.cpp (llama-cpp-python and llama-bench), same GGUF and threads.

    bash bench/setup_reference.sh                      # once (or EDGE_SLM_REFERENCE_VENV / EDGE_SLM_LLAMA_BENCH)
    .venv/bin/python bench/bench_speed.py [--runs 5] [--threads 2] [--model PATH_OR_NAME] [--no-busy]

The three programs run as alternating fresh processes (the order rotates from run to run), each
started with a clean environment built here: PATH, HOME and LANG only, so no OMP_*/GOMP_*/NUMBA_*/
PYTHONPATH of this process reaches them (the earlier table measured a llama.cpp that had inherited
OMP_WAIT_POLICY=PASSIVE). Ours sets its own OpenMP policy when it imports, as it does for users.
- ours: bench/worker_ours.py (the engine as the node configures it)
- llama-cpp-python: bench/worker_llama.py under the reference venv (per-token eval loop, argmax)
- llama-bench: pp256, tg128 and pp<CNC prompt tokens>, -r 1 per process, JSON output
The busy row runs each program's decode while one other process (started here, the same for all
three) spins on one core; every program keeps its default settings (llama.cpp its 2 threads).
Before each process the bench waits (up to --max-wait s) until other processes use less than
--quiet-below % of the cores: on this shared 2-core machine llama.cpp's two spinning threads lose
far more to a third runnable process than our engine does, so contended runs flatter us. A run
during which others still took more than --contended-above % is measured again (--retries times;
every attempt stays in the file, the table uses the first uncontended one).
The table shows medians; ratios are ours / the faster reference. Every run is appended to
bench/results/speed_runs.json with the date, commit, machine and load.
"""
import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
RESULTS = os.path.join(HERE, "results", "speed_runs.json")
SIDES = ("ours", "llama-cpp-python", "llama-bench")
LEAKY_PREFIXES = ("OMP_", "GOMP_", "KMP_", "NUMBA_", "PYTHON", "LD_", "MKL_", "OPENBLAS_", "GGML_", "LLAMA_")

# targets from issue 15, per model family: (SmolLM2-135M Q4_1, Qwen2.5-Coder-1.5B Q4_K_M)
TARGETS = {
    "decode": (1.3, 1.2), "prefill": (1.3, 1.2), "busy": (1.5, 1.3), "aggregate": (3.0, 2.5),
    "per_session": (1.5, 1.5), "ttft": (0.15, 0.15),
}


def target_column(model_path):
    name = os.path.basename(model_path).lower()
    if "smollm2" in name:
        return 0
    if "1.5b" in name:
        return 1
    return None


# ---- processes ------------------------------------------------------------------------------
def clean_env():
    """The whole environment of every process the bench starts; built, never copied from os.environ."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.path.expanduser("~"),
            "LANG": os.environ.get("LANG", "C.UTF-8")}


def reference_python():
    venv = os.environ.get("EDGE_SLM_REFERENCE_VENV") or os.path.join(HERE, ".refvenv")
    path = os.path.join(venv, "bin", "python")
    return path if os.path.exists(path) else None


def llama_bench_path():
    path = os.environ.get("EDGE_SLM_LLAMA_BENCH") or os.path.join(HERE, ".llama-build", "bin", "llama-bench")
    return path if os.path.exists(path) else None


def busy_jiffies():
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]            # all but idle and iowait


def run_process(command, timeout=3600):
    """-> (stdout, wall s, cpu s of the process, % of all cores used by other processes meanwhile)."""
    env = clean_env()
    assert not any(key.startswith(LEAKY_PREFIXES) for key in env), env
    hz = os.sysconf("SC_CLK_TCK")
    usage, jiffies, started = resource.getrusage(resource.RUSAGE_CHILDREN), busy_jiffies(), time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    other = 100.0 * ((busy_jiffies() - jiffies) / hz - own) / (os.cpu_count() * wall)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command[:3])} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout, wall, own, other


def wait_quiet(below_pct, max_wait_s, window_s=2.0, windows=2):
    """Wait until other processes used less than below_pct % of all cores in `windows` consecutive
    windows (nothing of ours runs meanwhile), at most max_wait_s -> (seconds waited, last window's %)."""
    hz, started, quiet, pct = os.sysconf("SC_CLK_TCK"), time.monotonic(), 0, 0.0
    while below_pct > 0:
        before = busy_jiffies()
        time.sleep(window_s)
        pct = 100.0 * (busy_jiffies() - before) / hz / (os.cpu_count() * window_s)
        quiet = quiet + 1 if pct < below_pct else 0
        if quiet >= windows or time.monotonic() - started > max_wait_s:
            break
    return time.monotonic() - started, pct


class Spinner:
    """One other process spinning on a core while the busy row is measured (the same for every side)."""

    def __enter__(self):
        self.process = subprocess.Popen([sys.executable, "-S", "-c", "while True: pass"], env=clean_env())
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        self.process.kill()
        self.process.wait()


def last_json(stdout):
    return json.loads(stdout.strip().splitlines()[-1])


def parse_llama_bench(stdout, cnc_tokens):
    """llama-bench -o json -> figures named like the workers'."""
    figures, tests = {}, json.loads(stdout)
    for test in tests:
        n_prompt, n_gen, threads, tps = test["n_prompt"], test["n_gen"], test["n_threads"], test["avg_ts"]
        suffix = "" if threads == tests[0]["n_threads"] else f"_t{threads}"
        if n_gen == 0 and n_prompt == cnc_tokens:
            figures["ttft_cold_ms" + suffix] = 1000.0 * n_prompt / tps
        elif n_gen == 0:
            figures[f"prefill_tps{suffix}"] = tps
            figures["prefill_tokens"] = n_prompt
        elif n_prompt == 0:
            figures[f"decode_tps{suffix}"] = tps
    first = tests[0]
    figures.update({"build_commit": first["build_commit"], "threads": first["n_threads"],
                    "flash_attn": first["flash_attn"], "poll": first["poll"], "cpu_info": first["cpu_info"],
                    "ttft_prompt_tokens": cnc_tokens})
    return figures


def side_command(side, condition, args, model, prompt_file, cnc_tokens):
    tokens = str(args.decode_tokens)
    if side == "ours":
        return [sys.executable, os.path.join(HERE, "worker_ours.py"), str(args.threads), "--model", model,
                "--mode", "full" if condition == "clean" else "decode", "--decode-tokens", tokens]
    if side == "llama-cpp-python":
        return [reference_python(), os.path.join(HERE, "worker_llama.py"), model, str(args.threads), prompt_file,
                "--mode", "full" if condition == "clean" else "decode", "--decode-tokens", tokens]
    common = [llama_bench_path(), "-m", model, "-r", "1", "-o", "json"]
    if condition == "clean":
        prompts = "256" if cnc_tokens in (0, 256) else f"256,{cnc_tokens}"
        return common + ["-t", str(args.threads), "-p", prompts, "-n", tokens]
    # the busy row: its default thread count (= --threads here), and 1 thread for the notes
    return common + ["-t", f"{args.threads},1" if args.threads != 1 else "1", "-p", "0", "-n", tokens]


# ---- the record -------------------------------------------------------------------------------
def machine():
    model_name = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, env=clean_env()).stdout
        model_name = next((line.split(":", 1)[1].strip() for line in out.splitlines()
                           if line.startswith("Model name")), "")
    except OSError:
        pass
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    return {"cpu": model_name, "cores": os.cpu_count(), "memory_gb": round(mem_kb / 2**20, 1),
            "kernel": os.uname().release}


def commit():
    def git(*a):
        return subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True, env=clean_env()).stdout.strip()
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results")
    return git("rev-parse", "--short", "HEAD") + ("-dirty" if dirty else "")


def now():
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def save(invocation):
    data = {}
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            data = json.load(f)
    if "invocations" not in data:                      # the file of the withdrawn table
        data = {"withdrawn_before_issue_15": data, "invocations": []} if data else {"invocations": []}
    found = [i for i, old in enumerate(data["invocations"]) if old["started"] == invocation["started"]]
    if found:
        data["invocations"][found[0]] = invocation
    else:
        data["invocations"].append(invocation)
    temporary = RESULTS + ".tmp"
    with open(temporary, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(temporary, RESULTS)


# ---- the table --------------------------------------------------------------------------------
def fmt(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def used(runs):
    """The records the table is made of: per run and side, the first uncontended attempt (or the last)."""
    return [r for r in runs if r.get("used", True)]


def median_of(runs, side, condition, key):
    values = per_run(runs, side, condition, key)
    return statistics.median(values) if values else None


def per_run(runs, side, condition, key):
    return [r["figures"][key] for r in used(runs) if r["side"] == side and r["condition"] == condition
            and key in r["figures"]]


def table(invocation, ours_note):
    runs, col = invocation["runs"], target_column(invocation["model"])
    rows = []      # label, ours, python, bench, ratio, target text, met

    def target(key, higher):
        if col is None:
            return "", None
        value = TARGETS[key][col]
        return (f">= {value:g}x" if higher else f"<= {value:g}x"), value

    def row(label, key, ours_key, ref_key, condition="clean", higher=True, target_key=None, digits=1):
        ours = median_of(runs, "ours", condition, ours_key)
        python = median_of(runs, "llama-cpp-python", condition, ref_key)
        bench = median_of(runs, "llama-bench", condition, ref_key)
        refs = [v for v in (python, bench) if v is not None]
        best = (max(refs) if higher else min(refs)) if refs else None
        ratio = ours / best if ours is not None and best else None
        text, value = target(target_key, higher) if target_key else ("", None)
        met = None if ratio is None or value is None else (ratio >= value if higher else ratio <= value)
        rows.append((label, ours, python, bench, ratio, text, met, digits))

    row("decode tok/s, 1 session", "decode", "decode_tps", "decode_tps", target_key="decode")
    row("prefill tok/s, 256-token prompt, cold", "prefill", "prefill_tps", "prefill_tps", target_key="prefill")
    row("decode tok/s, 1 session, one other process busy", "busy", "decode_tps", "decode_tps", condition="busy",
        target_key="busy")
    row("aggregate decode tok/s, 4 sessions (refs: 1 stream)", "aggregate", "aggregate4_tps", "decode_tps",
        target_key="aggregate")
    # ours only: the ratio of two figures of the same run, median over runs (host drift cancels)
    ratios = [r["figures"]["per_session4_ms"] / r["figures"]["single_ms"] for r in used(runs)
              if r["side"] == "ours" and r["condition"] == "clean" and "per_session4_ms" in r["figures"]]
    ratio = statistics.median(ratios) if ratios else None
    text, value = target("per_session", False)
    rows.append(("per-session ms/token, 4 at once / alone (ours)", median_of(runs, "ours", "clean", "per_session4_ms"),
                 None, None, ratio, text, None if ratio is None or value is None else ratio <= value, 1))
    row("first token ms: ours shared CNC prompt, ref cold", "ttft", "ttft_shared_ms", "ttft_cold_ms", higher=False,
        target_key="ttft", digits=0)
    row("first token ms, CNC prompt + command, cold", "ttft_cold", "ttft_cold_ms", "ttft_cold_ms", higher=False,
        digits=0)
    row("decode tok/s, 1 session on the CNC prompt", "cnc", "decode_cnc_tps", "decode_cnc_tps")
    row("start-up to ready, s", "startup", "startup_s", "startup_s", higher=False, digits=2)

    bw = invocation.get("bandwidth")
    if bw:
        bound = bw["bound_tps_2_threads"]
        values = [median_of(runs, side, "clean", "decode_tps") for side in SIDES]
        rows.append((f"decode, % of bandwidth / weight bytes per token ({bound:.0f} tok/s)",
                     *[None if v is None else 100.0 * v / bound for v in values], None, "", None, 0))

    head = "| figure | ours | llama-cpp-python | llama-bench | ours / faster ref | target | met |"
    lines = [head, "|---|---:|---:|---:|---:|---|---|"]
    for label, ours, python, bench, ratio, text, met, digits in rows:
        ours_text = ours_note if ours_note and ours is None else fmt(ours, digits)
        lines.append(f"| {label} | {ours_text} | {fmt(python, digits)} | {fmt(bench, digits)} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}x'} | {text} | "
                     f"{'' if met is None else ('yes' if met else '**no**')} |")
    return "\n".join(lines)


def notes(invocation):
    runs, out = invocation["runs"], []
    bw = invocation.get("bandwidth")
    if bw:
        w = bw["weights"]
        out.append(f"bandwidth (bench_bandwidth.py, 1 GiB buffer): {bw['gb_per_s_1gib']['1']:.1f} GB/s 1 thread, "
                   f"{bw['gb_per_s_1gib']['2']:.1f} GB/s 2 threads; a decode step reads {w['bytes_per_token'] / 2**20:.1f} "
                   f"MiB of weights (layer matrices {w['layer_matrix_bytes'] / 2**20:.1f} + {w['head_tensor']} "
                   f"{w['head_bytes'] / 2**20:.1f}) -> bound {bw['bound_tps_1_thread']:.0f} tok/s (1 thread), "
                   f"{bw['bound_tps_2_threads']:.0f} (2); a buffer of that size reads at "
                   f"{bw['gb_per_s_model_sized']['1']:.1f} / {bw['gb_per_s_model_sized']['2']:.1f} GB/s "
                   f"(-> {bw['bound_tps_model_sized_2_threads']:.0f} tok/s): weights smaller than the L3 the VM "
                   f"reports (lscpu) need not come from memory")
    for key, label in (("decode_tps", "decode"), ("prefill_tps", "prefill")):
        python = median_of(runs, "llama-cpp-python", "clean", key)
        bench = median_of(runs, "llama-bench", "clean", key)
        if python and bench:
            out.append(f"reference check, {label}: llama-cpp-python / llama-bench = {python / bench:.2f}")
    forward = median_of(runs, "ours", "clean", "decode_forward_tps")
    if forward is not None:
        out.append(f"ours, timed by wall clock from the first token to the last (as the llama-cpp-python loop is "
                   f"timed); the engine's forward passes alone: decode {forward:.1f} tok/s, prefill "
                   f"{median_of(runs, 'ours', 'clean', 'prefill_forward_tps'):.1f} tok/s, 4-session aggregate "
                   f"{median_of(runs, 'ours', 'clean', 'aggregate4_forward_tps'):.1f} tok/s")
    overhead = median_of(runs, "llama-cpp-python", "clean", "decode_overhead_ms")
    decode = median_of(runs, "llama-cpp-python", "clean", "decode_tps")
    if overhead is not None and decode:
        out.append(f"llama-cpp-python decode: {overhead:.2f} ms of each {1000.0 / decode:.2f} ms token outside "
                   f"llama_decode (Python eval bookkeeping, logits view, argmax); its context has flash_attn off "
                   f"(its default), llama-bench 'auto' (flash_attn={_first(runs, 'llama-bench', 'flash_attn')})")
    one = median_of(runs, "llama-bench", "busy", "decode_tps_t1")
    if one is not None:
        out.append(f"busy row, not in the ratio: llama-bench with 1 thread instead of its default decodes "
                   f"{one:.1f} tok/s under the same load")
    for side in SIDES:
        for condition in ("clean", "busy"):
            values = per_run(runs, side, condition, "decode_tps")
            if values:
                out.append(f"runs, {side} {condition} decode tok/s: {', '.join(f'{v:.1f}' for v in values)}")
    kept = used(runs)
    others = [r["other_cpu_pct"] for r in kept if r["condition"] == "clean"]
    busy_others = [r["other_cpu_pct"] for r in kept if r["condition"] == "busy"]
    loads = [r["loadavg_before"][0] for r in kept]
    again = sum(1 for r in runs if not r.get("used", True))
    still = sum(1 for r in kept if r.get("contended"))
    out.append(f"{again} contended attempts measured again (kept in the file, not in the table); {still} of the "
               f"{len(kept)} figures in the table are from contended attempts (the last allowed)")
    if others:
        out.append(f"CPU used by other processes during the clean runs: median {statistics.median(others):.0f} % "
                   f"of the {os.cpu_count()} cores (range {min(others):.0f}-{max(others):.0f} %); 1-min load "
                   f"average before the runs {min(loads):.2f}-{max(loads):.2f}")
    if busy_others:
        out.append(f"the same during the busy runs (the spinner counts: 1 core = {100 / os.cpu_count():.0f} %): "
                   f"median {statistics.median(busy_others):.0f} % (range {min(busy_others):.0f}-"
                   f"{max(busy_others):.0f} %)")
    return out


def _first(runs, side, key):
    return next((r["figures"][key] for r in runs if r["side"] == side and key in r["figures"]), None)


def bandwidth(model, args):
    """bench_bandwidth.py in a fresh process, measured again (like the runs) while others took the cores."""
    for attempt in range(1, args.retries + 2):
        wait_quiet(args.quiet_below, args.max_wait)
        stdout, _, _, other = run_process([sys.executable, os.path.join(HERE, "bench_bandwidth.py"), "--json",
                                           "--passes", "7", "--model", model])
        if other <= args.contended_above:
            break
        print(f"bandwidth: others used {other:.0f} % of the cores meanwhile"
              + ("; measuring again" if attempt <= args.retries else "; kept (last attempt)"), flush=True)
    data = last_json(stdout)
    memory = {str(r["threads"]): r["gb_per_s"] for r in data["results"] if r["mb"] == 1024.0}
    model_sized = {str(r["threads"]): r["gb_per_s"] for r in data["results"] if r["mb"] != 1024.0}
    per_token = data["weights"]["bytes_per_token"]
    return {"gb_per_s_1gib": memory, "gb_per_s_model_sized": model_sized, "weights": data["weights"],
            "bound_tps_2_threads": memory["2"] * 1e9 / per_token, "bound_tps_1_thread": memory["1"] * 1e9 / per_token,
            "bound_tps_model_sized_2_threads": model_sized["2"] * 1e9 / per_token, "loadavg": data["loadavg"],
            "other_cpu_pct": other, "attempts": attempt}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="", help="a GGUF path or a known model name (default: SmolLM2)")
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--no-busy", action="store_true", help="skip the busy row")
    parser.add_argument("--quiet-below", type=float, default=10.0,
                        help="before each process wait until other processes use less than this %% of the cores "
                             "(0: do not wait)")
    parser.add_argument("--max-wait", type=float, default=300.0, help="seconds to wait for that, at most")
    parser.add_argument("--contended-above", type=float, default=15.0,
                        help="a run during which other processes (beyond the busy row's spinner) used more than "
                             "this %% of the cores is recorded as contended and measured again")
    parser.add_argument("--retries", type=int, default=2, help="how often, at most (the last attempt is kept)")
    parser.add_argument("--sides", default=",".join(SIDES), help="comma-separated subset of " + ",".join(SIDES))
    parser.add_argument("--show", metavar="STARTED", help="only print the table of a saved invocation ('last' "
                        "or its 'started' time) from bench/results/speed_runs.json")
    args = parser.parse_args()
    if args.show:
        return show(args.show)
    from edge_slm_node.engine.config_files import DEFAULT_SYSTEM_PROMPT_FILE, config_dir
    from edge_slm_node.model.catalog import CatalogError
    from edge_slm_node.model.loader import resolve_model_path
    try:
        model = os.path.abspath(resolve_model_path(args.model))
    except (CatalogError, FileNotFoundError) as error:
        sys.exit(f"--model {args.model!r}: {error}")
    prompt_file = os.path.join(config_dir(), DEFAULT_SYSTEM_PROMPT_FILE)
    sides = [s for s in args.sides.split(",") if s]
    missing = [s for s, ok in (("llama-cpp-python", reference_python()), ("llama-bench", llama_bench_path()))
               if s in sides and not ok]
    if missing:
        sys.exit(f"no {' or '.join(missing)}: run bash bench/setup_reference.sh, or point EDGE_SLM_REFERENCE_VENV "
                 f"/ EDGE_SLM_LLAMA_BENCH at existing builds")

    invocation = {"started": now(), "command": " ".join(["bench/bench_speed.py", *sys.argv[1:]]), "model": model,
                  "model_bytes": os.path.getsize(model), "threads": args.threads,
                  "decode_tokens": args.decode_tokens, "commit": commit(), "machine": machine(),
                  "loadavg_start": os.getloadavg(), "environment_given": sorted(clean_env()), "runs": []}
    print(f"{os.path.basename(model)}, {args.threads} threads, {args.runs} alternating runs; "
          f"{invocation['machine']['cpu']}, {invocation['machine']['cores']} cores; commit {invocation['commit']}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    cnc_tokens = 0
    if reference_python():
        info = last_json(run_process([reference_python(), os.path.join(HERE, "worker_llama.py"), model,
                                      str(args.threads), prompt_file, "--mode", "tokens"])[0])
        cnc_tokens, system_info = info["ttft_prompt_tokens"], info["system_info"]
        invocation["reference"] = {"llama_cpp_python": info["version"], "system_info": system_info,
                                   "environment_seen": info["environment"]}
        print(f"llama-cpp-python {info['version']} llama_print_system_info(): {system_info}")
        print(f"  environment it saw: {', '.join(info['environment'])}")
        if "AVX2 = 1" not in system_info or "FMA = 1" not in system_info:
            print("  WARNING: the reference is not a native build (no AVX2/FMA): its figures are not llama.cpp's")
        library = os.path.join(os.path.dirname(llama_bench_path() or ""), "libllama.so")
        if llama_bench_path() and os.path.exists(library):
            code = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
                    "lib.llama_print_system_info.restype = ctypes.c_char_p; print(lib.llama_print_system_info().decode())")
            bench_info = run_process([reference_python(), "-c", code, library])[0].strip()
            invocation["reference"]["llama_bench_system_info"] = bench_info
            invocation["reference"]["llama_bench"] = llama_bench_path()
            print(f"llama-bench ({llama_bench_path()}) libllama system info: {bench_info}")
    invocation["bandwidth"] = bandwidth(model, args)
    bw = invocation["bandwidth"]
    print(f"read bandwidth (1 GiB buffer) {bw['gb_per_s_1gib']['1']:.1f} GB/s 1 thread, {bw['gb_per_s_1gib']['2']:.1f} "
          f"GB/s 2 threads; weights per decode step {bw['weights']['bytes_per_token'] / 2**20:.1f} MiB -> bound "
          f"{bw['bound_tps_1_thread']:.0f} / {bw['bound_tps_2_threads']:.0f} tok/s; a buffer that size: "
          f"{bw['gb_per_s_model_sized']['2']:.1f} GB/s 2 threads ({bw['bound_tps_model_sized_2_threads']:.0f} tok/s)",
          flush=True)

    ours_note, conditions = None, ["clean"] + ([] if args.no_busy else ["busy"])
    spinner_pct = 100.0 / os.cpu_count()
    for index in range(args.runs):
        order = sides[index % len(sides):] + sides[:index % len(sides)]
        for condition in conditions:
            for side in order:
                if side == "ours" and ours_note:
                    continue
                command = side_command(side, condition, args, model, prompt_file, cnc_tokens)
                for attempt in range(1, args.retries + 2):
                    waited, others_before = wait_quiet(args.quiet_below, args.max_wait)
                    record = {"run": index + 1, "attempt": attempt, "side": side, "condition": condition,
                              "date": now(), "loadavg_before": os.getloadavg(), "quiet_wait_s": waited,
                              "other_cpu_pct_before": others_before}
                    if condition == "busy":
                        with Spinner():
                            stdout, wall, own, other = run_process(command)
                    else:
                        stdout, wall, own, other = run_process(command)
                    figures = parse_llama_bench(stdout, cnc_tokens) if side == "llama-bench" else last_json(stdout)
                    if "unsupported" in figures:
                        ours_note = "n/a (model not supported)"
                        invocation["ours_unsupported"] = figures["unsupported"]
                        print(f"ours: {figures['unsupported']}", flush=True)
                        break
                    # others' share beyond the spinner's, while this process ran
                    contended = other - (spinner_pct if condition == "busy" else 0.0) > args.contended_above
                    last = attempt == args.retries + 1
                    record.update({"figures": figures, "wall_s": wall, "cpu_s": own, "other_cpu_pct": other,
                                   "contended": contended, "used": not contended or last})
                    invocation["runs"].append(record)
                    save(invocation)
                    print(f"run {index + 1}/{args.runs} {condition:5s} {side:16s} decode "
                          f"{figures.get('decode_tps', 0):6.1f} tok/s  prefill {fmt(figures.get('prefill_tps'))}  "
                          f"(load {record['loadavg_before'][0]:.2f}, others {other:.0f} % of the cores; waited "
                          f"{waited:.0f} s){'  contended: ' + ('kept, last attempt' if last else 'again') if contended else ''}",
                          flush=True)
                    if record["used"]:
                        break
    invocation["finished"], invocation["loadavg_end"] = now(), os.getloadavg()
    save(invocation)

    print()
    report(invocation)


def report(invocation):
    ours_note = "n/a (model not supported)" if invocation.get("ours_unsupported") else None
    kept = used(invocation["runs"])
    runs = max((r["run"] for r in kept), default=0)
    print(f"{os.path.basename(invocation['model'])}, {invocation['threads']} threads, medians of {runs} alternating "
          f"fresh processes per side; {invocation['started']} - {invocation.get('finished', '?')}; commit "
          f"{invocation['commit']}; {invocation['machine']['cpu']}, {invocation['machine']['cores']} cores; load "
          f"average at start {invocation['loadavg_start'][0]:.2f}, at end {invocation.get('loadavg_end', [0])[0]:.2f}")
    print(f"command: {invocation['command']}")
    print(table(invocation, ours_note))
    for line in notes(invocation):
        print(f"- {line}")
    if ours_note:
        print(f"- ours: {invocation['ours_unsupported']}")
    faults = median_of(invocation["runs"], "ours", "clean", "faults_per_token")
    if faults is not None:
        print(f"- ours: page faults per decoded token {faults:.3f} (keep < 0.01)")
    print(f"- every run: {os.path.relpath(RESULTS, ROOT)} (invocation started {invocation['started']})")


def show(started):
    with open(RESULTS) as f:
        invocations = json.load(f).get("invocations", [])
    chosen = invocations[-1:] if started == "last" else [i for i in invocations if i["started"] == started]
    if not chosen:
        sys.exit(f"no invocation {started!r} in {RESULTS}")
    report(chosen[0])


if __name__ == "__main__":
    main()
