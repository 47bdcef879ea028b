"""Prompts shared by both sides of the benchmarks (same text, same GGUF, same threads)."""
import time

COMMAND_16 = "Spindle 2 shows alarm 108 after the tool change. What should I check first?"
DECODE_TOKENS = 128
PROMPT_TOKENS = 256
LONG_TEXT = ("The operator loads the vise, touches off tool 4 on the setter, checks the coolant concentration "
             "and runs the warm-up program O9000 before the first aluminium part of the shift. ")


def long_prompt(tokenizer, tokens: int = PROMPT_TOKENS) -> str:
    """Repeat LONG_TEXT and cut it at `tokens` tokens of this tokenizer."""
    text = LONG_TEXT * (tokens // 20 + 2)
    return tokenizer.decode(tokenizer.encode(text)[:tokens])


def timed_decode_steps(engine, names, params, before_timing=None) -> list:
    """One command per session in `names` (created), prompts run untimed, then every step timed
    until all answers are done -> seconds per step. before_timing() runs once the prompts are done.
    The sessions are reset afterwards."""
    requests = [engine.submit(name, f"Describe alarm {100 + i} on a CNC mill.", params)
                for i, name in enumerate(names)]
    while not all(r.decode_steps for r in requests):
        engine.step()
    if before_timing is not None:
        before_timing()
    steps = []
    while not all(r.done for r in requests):
        started = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - started)
    for name in names:
        engine.reset_session(name)
    return steps
