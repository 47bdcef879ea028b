"""llama.cpp's vocabulary conventions, as data: pre-tokenizer regexes and special-token texts.

Source: llama.cpp ``src/llama-vocab.cpp`` (as vendored by llama-cpp-python 0.3.36):
``llm_tokenizer_bpe`` (regexes per pre-tokenizer type), ``llama_vocab::impl::load``
(``tokenizer.ggml.pre`` name -> type, ``ignore_merges``, default ``add_bos``) and the
end-of-generation (EOG) detection by token text. The regexes are applied one after another,
each splitting the pieces produced by the previous one (unmatched text stays a piece), then
every piece is byte-level encoded and merged by BPE on its own.
"""
from __future__ import annotations

from dataclasses import dataclass

# GGUF tokenizer.ggml.token_type values (llama.h enum llama_token_type)
TOKEN_TYPE_UNDEFINED = 0
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
    r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
    r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")


@dataclass(frozen=True)
class PreTokenizerRule:
    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a whole piece found in the vocabulary is one token
    add_bos: bool = False  # llama.cpp's default when the GGUF has no add_bos_token


_SMOLLM = PreTokenizerRule((r"\p{N}", _GPT2))  # digits one by one, then GPT-2
_GPT2_RULE = PreTokenizerRule((_GPT2,))
_LLAMA3_RULE = PreTokenizerRule((_LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2_RULE = PreTokenizerRule((_QWEN2,))

# tokenizer.ggml.pre -> rule (a subset of llama.cpp's table; names as llama.cpp spells them)
PRE_TOKENIZERS: dict[str, PreTokenizerRule] = {
    "default": PreTokenizerRule(_DEFAULT),
    "smollm": _SMOLLM,
    "starcoder": _SMOLLM,
    "refact": _SMOLLM,
    "codeshell": _SMOLLM,
    "gpt-2": _GPT2_RULE,
    "gpt2": _GPT2_RULE,  # not a llama.cpp name; accepted as an alias of "gpt-2"
    "phi-2": _GPT2_RULE,
    "qwen2": _QWEN2_RULE,
    "deepseek-r1-qwen": _QWEN2_RULE,
    "llama-bpe": _LLAMA3_RULE,
    "llama3": _LLAMA3_RULE,
    "llama-v3": _LLAMA3_RULE,
}

SUPPORTED_TOKENIZER_MODELS = ("gpt2", "llama")  # tokenizer.ggml.model: byte-level BPE, SentencePiece

# llama.cpp's defaults for a "llama" (SentencePiece) vocabulary whose GGUF does not say
SPM_DEFAULT_BOS_ID = 1
SPM_DEFAULT_EOS_ID = 2
SPM_DEFAULT_ADD_BOS = True
SPM_DEFAULT_ADD_SPACE_PREFIX = True

# llama.cpp's defaults for a "gpt2" vocabulary whose GGUF names no bos/eos id
GPT2_DEFAULT_BOS_ID = 11
GPT2_DEFAULT_EOS_ID = 11

# Tokens that end generation because of their text (llama.cpp marks them CONTROL, too).
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
})
# Fill-in-the-middle tokens that llama.cpp also treats as EOG when the GGUF names none.
FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
FIM_SEP_TEXTS = ("<|file_sep|>",)
# Other texts llama.cpp recognises as special (EOT, EOM, FIM prefix/suffix/middle); it forces
# them to CONTROL, which makes them parse as special tokens inside text.
OTHER_SPECIAL_TEXTS = frozenset({
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>",
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
    "<|code_suffix|>", "<|suffix|>",
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
    "<|code_middle|>", "<|middle|>",
})
FORCED_CONTROL_TEXTS = (
    EOG_TEXTS | OTHER_SPECIAL_TEXTS | set(FIM_PAD_TEXTS) | set(FIM_REP_TEXTS) | set(FIM_SEP_TEXTS)
)


def end_of_generation_ids(
    tokens: list[str],
    text_to_id: dict[str, int],
    named_ids: dict[str, int | None],
) -> frozenset[int]:
    """The EOG set llama.cpp builds: FIM pad/repo/sep, EOG texts, then eos/eot/eom ids.

    ``named_ids`` holds the ids the GGUF names (keys: eos, eot, eom, fim_pad, fim_rep, fim_sep;
    None when absent).
    """
    eog: set[int] = set()
    for name, texts in (("fim_pad", FIM_PAD_TEXTS), ("fim_rep", FIM_REP_TEXTS), ("fim_sep", FIM_SEP_TEXTS)):
        token_id = named_ids.get(name)
        if token_id is None:
            found = [text_to_id[text] for text in texts if text in text_to_id]
            token_id = min(found) if found else None
        if token_id is not None:
            eog.add(token_id)
    eog.update(text_to_id[text] for text in EOG_TEXTS if text in text_to_id)
    eog.update(named_ids[name] for name in ("eos", "eot", "eom") if named_ids.get(name) is not None)

    texts = {token_id: tokens[token_id] for token_id in eog}
    present = set(texts.values())
    # harmony / solar-open: "<|end|>" is not EOG when the return/call markers exist
    has_call = bool({"<|call|>", "<|calls|>"} & present)
    if "<|end|>" in present and has_call and ("<|return|>" in present or "<|flush|>" in present):
        eog -= {token_id for token_id, text in texts.items() if text == "<|end|>"}
    # gemma4 / plamo: "</s>" is a normal token there
    if "</s>" in present and ({"<|tool_response>", "<|plamo:eos|>"} & present):
        eog -= {token_id for token_id, text in texts.items() if text == "</s>"}
    return frozenset(eog)
