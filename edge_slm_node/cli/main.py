"""`edge-slm`: generate, tokenize and chat from a terminal, without ROS; list and install models."""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time

from ..engine.config import ConfigError, EngineConfig
from ..engine.sampling import InvalidRequestError, SamplingParams
from ..model import catalog
from ..model.gguf_file import GGUFError

CLI_KV_POOL_MB = 48.0          # one session of 2048 tokens (22.5 KiB each for SmolLM2-135M)


def _engine(args, system_prompt=None):
    from ..engine.engine import Engine
    config = EngineConfig(model_path=args.model or "", kv_pool_mb=CLI_KV_POOL_MB,
                          num_threads=getattr(args, "threads", 2), system_prompt=system_prompt)
    return Engine(config)


def _sampling(args) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          repetition_penalty=args.repeat_penalty, seed=args.seed,
                          max_new_tokens=args.max_new_tokens, ignore_eos=args.ignore_eos,
                          stop=tuple(args.stop or ()))


def cmd_generate(args) -> int:
    started = time.monotonic()
    engine = _engine(args, system_prompt=args.system)
    load_s = time.monotonic() - started
    session = engine.create_session("cli", system_prompt=None if args.system else "")
    for piece in engine.generate(session.session_id, args.prompt, _sampling(args), raw=args.raw):
        sys.stdout.write(piece)
        sys.stdout.flush()
    request = engine.last_request
    sys.stdout.write("\n")
    if request.error:
        print(f"error: {request.error}", file=sys.stderr)
    if args.json:
        print(json.dumps({
            "prompt_ids": request.prompt_ids,
            "generated_ids": request.generated_ids,
            "text": request.text_out,
            "finish_reason": request.finish_reason.value,
            "timings": {"load_s": round(load_s, 4),
                        "prefill_tokens": len(request.prompt_ids) - request.cached_prompt_tokens,
                        "prefill_s": round(request.prefill_seconds, 4),
                        "decode_tokens": request.decode_steps,
                        "decode_s": round(request.decode_seconds, 4)},
        }, ensure_ascii=False))
    return 0 if request.finish_reason.value != "error" else 1


def cmd_tokenize(args) -> int:
    from ..model.gguf_file import GGUFFile
    from ..model.loader import resolve_model_path
    from ..model.tokenizer import Tokenizer
    tokenizer = Tokenizer.from_metadata(GGUFFile(resolve_model_path(args.model)).metadata)
    ids = tokenizer.encode(args.text)
    print(json.dumps({"ids": ids}) if args.json else " ".join(map(str, ids)))
    return 0


def cmd_chat(args) -> int:
    from ..engine.config_files import default_system_prompt
    engine = _engine(args, system_prompt=args.system or default_system_prompt())
    session = engine.create_session("chat")
    print("edge-slm chat: /reset forgets the conversation, /quit or Ctrl-D leaves.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if line.strip() in ("/quit", "/exit"):
            return 0
        if line.strip() == "/reset":
            engine.reset_session(session.session_id)
            continue
        try:
            for piece in engine.generate(session.session_id, line, _sampling(args)):
                sys.stdout.write(piece)
                sys.stdout.flush()
        except InvalidRequestError as error:
            print(f"error: {error}", file=sys.stderr)
            continue
        request = engine.last_request
        print(f"\n[{request.finish_reason.value}: {len(request.generated_ids)} tokens, "
              f"{request.decode_tokens_per_s:.1f} tok/s]" + (f" {request.error}" if request.error else ""),
              file=sys.stderr)


def cmd_models_list(args) -> int:
    directory = catalog.models_dir()
    rows = [{"name": m.name, "architecture": m.architecture, "quant": m.quant, "size": m.size,
             "status": catalog.status(m, directory), "path": catalog.model_file(m, directory), "note": m.note}
            for m in catalog.MODELS]
    if args.json:
        print(json.dumps({"models_dir": directory, "models": rows}))
        return 0
    header = ("name", "arch", "quant", "size", "installed", "path")
    table = [header] + [(r["name"], r["architecture"], r["quant"], f"{r['size'] / 1e6:,.0f} MB",
                         {"installed": "yes", "missing": "no"}.get(r["status"], r["status"]), r["path"])
                        for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    print(f"\nedge-slm models install NAME  (into {directory}; ${catalog.MODELS_DIR_ENV} overrides)",
          file=sys.stderr)
    return 0


def _raise_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)             # so that an install being stopped removes its temporary files


def cmd_models_install(args) -> int:
    model = catalog.get(args.name)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    print(f"{model.name}: {model.architecture} {model.quant}, {model.size:,} bytes from "
          f"{len(model.parts)} package(s)", file=sys.stderr)
    started = time.monotonic()
    path, done = catalog.install(model, force=args.force, log=lambda line: print(f"  {line}", file=sys.stderr))
    if done == "already installed":
        print(f"{model.name}: already installed and verified, nothing to do", file=sys.stderr)
    else:
        print(f"{model.name}: {done}, sha256 ok ({time.monotonic() - started:.1f} s)", file=sys.stderr)
    print(path)
    return 0


def cmd_models_path(args) -> int:
    print(catalog.installed_path(catalog.get(args.name)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge-slm", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    def model_option(p):
        p.add_argument("--model", default="", help="GGUF path or known model name (edge-slm models); "
                                                   "default: bundled SmolLM2-135M-Instruct Q4_1")

    def sampling_options(p, max_new_tokens):
        p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
        p.add_argument("--top-k", type=int, default=0)
        p.add_argument("--top-p", type=float, default=1.0)
        p.add_argument("--repeat-penalty", type=float, default=1.0)
        p.add_argument("--seed", type=int, default=None)
        p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
        p.add_argument("--ignore-eos", action="store_true")
        p.add_argument("--stop", action="append", help="stop string (repeatable)")
        p.add_argument("--threads", type=int, default=2)

    generate = commands.add_parser("generate", help="stream one answer to stdout")
    model_option(generate)
    generate.add_argument("--system", default=None, help="system prompt (default: none)")
    generate.add_argument("--raw", action="store_true", help="PROMPT as is: no chat template")
    generate.add_argument("--json", action="store_true", help="last line: ids, text and timings as JSON")
    sampling_options(generate, 128)
    generate.add_argument("prompt")
    generate.set_defaults(run=cmd_generate)

    tokenize = commands.add_parser("tokenize", help="print token ids (special tokens parsed, no BOS)")
    model_option(tokenize)
    tokenize.add_argument("--json", action="store_true")
    tokenize.add_argument("text")
    tokenize.set_defaults(run=cmd_tokenize)

    chat = commands.add_parser("chat", help="multi-turn conversation with the CNC system prompt")
    model_option(chat)
    chat.add_argument("--system", default=None, help="system prompt (default: config/cnc_system_prompt.txt)")
    sampling_options(chat, 256)
    chat.set_defaults(run=cmd_chat)

    models = commands.add_parser("models", help="list the known models; install one (edge-slm models install NAME)")
    models.add_argument("--json", action="store_true")
    models.set_defaults(run=cmd_models_list)
    models_commands = models.add_subparsers(dest="models_command")
    listing = models_commands.add_parser("list", help="the known models, installed or not (the default)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(run=cmd_models_list)
    install = models_commands.add_parser("install", help="download the model's packages, assemble and verify the "
                                                          "GGUF; prints its path")
    install.add_argument("name", help="a name from `edge-slm models`")
    install.add_argument("--force", action="store_true", help="download and assemble again even if installed")
    install.set_defaults(run=cmd_models_install)
    path = models_commands.add_parser("path", help="print the installed model's path (exit 2 if not installed)")
    path.add_argument("name")
    path.set_defaults(run=cmd_models_path)
    return parser


def show_loading_progress() -> None:
    """The engine logs each loading stage (edge_slm_node.loading, INFO); on the console they go
    to stderr, so `--json` output on stdout stays one document."""
    progress_log = logging.getLogger("edge_slm_node.loading")
    if not any(getattr(h, "edge_slm_console", False) for h in progress_log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("edge-slm: %(message)s"))
        handler.edge_slm_console = True
        progress_log.addHandler(handler)
    progress_log.setLevel(logging.INFO)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    show_loading_progress()
    try:
        return args.run(args)
    except (FileNotFoundError, GGUFError, ConfigError, InvalidRequestError, catalog.CatalogError) as error:
        print(f"edge-slm: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("edge-slm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
