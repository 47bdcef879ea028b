"""One measurement run of llama.cpp (llama-cpp-python) on the same GGUF; prints one JSON line.

    REFERENCE_PYTHON worker_llama.py MODEL THREADS SYSTEM_PROMPT_FILE [--mode full|decode] [--decode-tokens N]

Runs under the reference venv made by bench/setup_reference.sh; driven by bench_speed.py, which
starts it with a clean environment (PATH, HOME, LANG only). --mode decode measures only the
single-stream decode (the busy row); --mode tokens only loads the vocabulary and prints the
CNC prompt's token count and llama_print_system_info()."""
import argparse
import json
import os
import sys
import time

STARTED = time.monotonic()
import llama_cpp                                 # noqa: E402
import numpy as np                               # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import COMMAND_16, DECODE_TOKENS, LONG_TEXT, PROMPT_TOKENS   # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_path")
    parser.add_argument("threads", type=int)
    parser.add_argument("system_prompt_file")
    parser.add_argument("--mode", choices=("full", "decode", "tokens"), default="full")
    parser.add_argument("--decode-tokens", type=int, default=DECODE_TOKENS)
    args = parser.parse_args()
    threads, decode_tokens = args.threads, args.decode_tokens
    system = open(args.system_prompt_file).read().strip()
    chat = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{COMMAND_16}<|im_end|>\n"
            f"<|im_start|>assistant\n")
    if args.mode == "tokens":
        vocab_only = llama_cpp.Llama(args.model_path, vocab_only=True, verbose=False)
        print(json.dumps({"ttft_prompt_tokens": len(vocab_only.tokenize(chat.encode(), add_bos=False, special=True)),
                          "version": llama_cpp.__version__,
                          "system_info": llama_cpp.llama_print_system_info().decode().strip(),
                          "environment": sorted(os.environ)}))
        return
    # llama-cpp-python's own defaults otherwise (flash_attn off, n_batch 512); the thread count is
    # the bench's, as for the other two programs (its default would be cpu_count // 2 = 1 here)
    llm = llama_cpp.Llama(args.model_path, n_ctx=1024, n_threads=threads, n_threads_batch=threads, verbose=False)
    startup_s = time.monotonic() - STARTED
    tokenize = lambda text: llm.tokenize(text.encode(), add_bos=False, special=True)
    vocab = llm.n_vocab()
    common = {"version": llama_cpp.__version__, "system_info": llama_cpp.llama_print_system_info().decode().strip(),
              "threads": threads, "environment": sorted(os.environ)}

    def logits():
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(vocab,))

    def decode(first_prompt_ids):
        """-> decode tokens/s over decode_tokens - 1 steps after the prompt (first token from the prompt)."""
        llm.reset()
        llm.eval(first_prompt_ids)
        token = int(np.argmax(logits()))
        in_decode[0] = 0.0
        started = time.perf_counter()
        for _ in range(decode_tokens - 1):
            llm.eval([token])
            token = int(np.argmax(logits()))
        seconds = time.perf_counter() - started
        # time outside llama_decode (llama-cpp-python's eval bookkeeping, the logits view, argmax)
        overhead_ms.append(1000.0 * (seconds - in_decode[0]) / (decode_tokens - 1))
        return (decode_tokens - 1) / seconds

    in_decode, overhead_ms = [0.0], []
    c_decode = llm._ctx.decode

    def timed_decode(batch):                                     # llama_decode, timed
        before = time.perf_counter()
        try:
            return c_decode(batch)
        finally:
            in_decode[0] += time.perf_counter() - before

    llm._ctx.decode = timed_decode
    llm.reset()
    llm.eval(tokenize("Hello"))                                   # warm-up
    if args.mode == "decode":
        decode_tps = decode(tokenize("Explain what G01 does."))
        print(json.dumps({**common, "startup_s": startup_s, "decode_tps": decode_tps,
                          "decode_overhead_ms": overhead_ms[0], "loadavg_end": os.getloadavg()}))
        return
    long_ids = tokenize(LONG_TEXT * (PROMPT_TOKENS // 20 + 2))[:PROMPT_TOKENS]
    llm.reset()
    started = time.monotonic()
    llm.eval(long_ids)
    prefill_tps = len(long_ids) / (time.monotonic() - started)

    decode_tps = decode(tokenize("Explain what G01 does."))

    ids = tokenize(chat)
    llm.reset()
    started = time.monotonic()
    llm.eval(ids)
    token = int(np.argmax(logits()))
    ttft_ms = 1000.0 * (time.monotonic() - started)
    started = time.monotonic()                     # decoding on top of the CNC prompt, as deployed
    for _ in range(decode_tokens - 1):
        llm.eval([token])
        token = int(np.argmax(logits()))
    decode_cnc_tps = (decode_tokens - 1) / (time.monotonic() - started)
    print(json.dumps({**common, "startup_s": startup_s, "prefill_tps": prefill_tps, "prefill_tokens": len(long_ids),
                      "decode_tps": decode_tps, "ttft_cold_ms": ttft_ms, "ttft_prompt_tokens": len(ids),
                      "decode_cnc_tps": decode_cnc_tps,
                      "decode_overhead_ms": overhead_ms[0], "loadavg_end": os.getloadavg()}))


if __name__ == "__main__":
    main()
