"""One measurement run of llama.cpp (llama-cpp-python) on the same GGUF; prints one JSON line.

Runs under the reference venv made by bench/setup_reference.sh; driven by bench_speed.py."""
import json
import sys
import time

STARTED = time.monotonic()
import llama_cpp                                 # noqa: E402
import numpy as np                               # noqa: E402

sys.path.insert(0, __import__("os").path.dirname(__file__))
from common import COMMAND_16, DECODE_TOKENS, LONG_TEXT, PROMPT_TOKENS   # noqa: E402


def main():
    model_path, threads, system_prompt_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    llm = llama_cpp.Llama(model_path, n_ctx=1024, n_threads=threads, n_threads_batch=threads, verbose=False)
    startup_s = time.monotonic() - STARTED
    tokenize = lambda text: llm.tokenize(text.encode(), add_bos=False, special=True)
    vocab = llm.n_vocab()

    def logits():
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(vocab,))

    llm.reset()
    llm.eval(tokenize("Hello"))                                   # warm-up
    long_ids = tokenize(LONG_TEXT * (PROMPT_TOKENS // 20 + 2))[:PROMPT_TOKENS]
    llm.reset()
    started = time.monotonic()
    llm.eval(long_ids)
    prefill_tps = len(long_ids) / (time.monotonic() - started)

    llm.reset()
    llm.eval(tokenize("Explain what G01 does."))
    token = int(np.argmax(logits()))
    started = time.monotonic()
    for _ in range(DECODE_TOKENS - 1):
        llm.eval([token])
        token = int(np.argmax(logits()))
    decode_tps = (DECODE_TOKENS - 1) / (time.monotonic() - started)

    system = open(system_prompt_file).read().strip()
    chat = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{COMMAND_16}<|im_end|>\n"
            f"<|im_start|>assistant\n")
    ids = tokenize(chat)
    llm.reset()
    started = time.monotonic()
    llm.eval(ids)
    token = int(np.argmax(logits()))
    ttft_ms = 1000.0 * (time.monotonic() - started)
    started = time.monotonic()                     # decoding on top of the CNC prompt, as deployed
    for _ in range(DECODE_TOKENS - 1):
        llm.eval([token])
        token = int(np.argmax(logits()))
    decode_cnc_tps = (DECODE_TOKENS - 1) / (time.monotonic() - started)
    print(json.dumps({"startup_s": startup_s, "prefill_tps": prefill_tps, "decode_tps": decode_tps,
                      "ttft_cold_ms": ttft_ms, "ttft_prompt_tokens": len(ids), "decode_cnc_tps": decode_cnc_tps,
                      "version": llama_cpp.__version__}))


if __name__ == "__main__":
    main()
