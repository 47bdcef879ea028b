"""Prompts shared by both sides of the benchmarks (same text, same GGUF, same threads)."""
COMMAND_16 = "Spindle 2 shows alarm 108 after the tool change. What should I check first?"
DECODE_TOKENS = 128
PROMPT_TOKENS = 256
LONG_TEXT = ("The operator loads the vise, touches off tool 4 on the setter, checks the coolant concentration "
             "and runs the warm-up program O9000 before the first aluminium part of the shift. ")


def long_prompt(tokenizer, tokens: int = PROMPT_TOKENS) -> str:
    """Repeat LONG_TEXT and cut it at `tokens` tokens of this tokenizer."""
    text = LONG_TEXT * (tokens // 20 + 2)
    return tokenizer.decode(tokenizer.encode(text)[:tokens])
