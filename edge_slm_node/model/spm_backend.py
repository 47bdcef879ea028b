"""A ``tokenizers`` BPE model that tokenizes a SentencePiece vocabulary (``tokenizer.ggml.model``
= llama) as llama.cpp's ``llm_tokenizer_spm`` does.

llama.cpp starts from the UTF-8 characters of a text fragment (spaces written as U+2581) and
repeatedly merges the adjacent pair whose concatenation is a vocabulary token of the highest
score (leftmost on a tie); characters left that are no token become their <0xXX> byte tokens.
That is BPE with a merge for every way of writing a token as two tokens, ranked by the merged
token's score: the BPE model below, built from the GGUF's tokens and scores (~515k merges for
Gemma 3's 262k vocabulary). Unlike byte-level BPE there is no pre-tokenizer: the whole fragment
between special tokens is one word.
"""
from __future__ import annotations

from array import array

import numpy as np
from tokenizers import models, normalizers

SPACE = "\u2581"          # SentencePiece's visible space


def spm_merges(tokens: list[str], scores: list[float], text_to_id: dict[str, int]) -> list[tuple[str, str]]:
    """Every (left, right) with left, right and left + right in the vocabulary, best merged score first
    (ties: lower token id, then shorter left part). Ranked as C arrays and built from the vocabulary's
    own strings: ~515k merges held as Python objects cost ~160 MB more, which the heap keeps."""
    merged, cuts, lefts, rights = array("i"), array("i"), array("i"), array("i")
    for token_id, text in enumerate(tokens):
        if len(text) < 2 or text_to_id.get(text) != token_id:
            continue
        for cut in range(1, len(text)):
            left, right = text_to_id.get(text[:cut]), text_to_id.get(text[cut:])
            if left is not None and right is not None:
                merged.append(token_id)
                cuts.append(cut)
                lefts.append(left)
                rights.append(right)
    merged_ids = np.frombuffer(merged, np.int32)
    score = -np.asarray(scores, np.float64)[merged_ids]
    order = np.lexsort((np.frombuffer(cuts, np.int32), merged_ids, score))
    left_ids, right_ids = np.frombuffer(lefts, np.int32)[order].tolist(), np.frombuffer(rights, np.int32)[order].tolist()
    return [(tokens[left], tokens[right]) for left, right in zip(left_ids, right_ids)]


def spm_model(tokens: list[str], scores: list[float], text_to_id: dict[str, int]) -> models.BPE:
    if len(scores) != len(tokens):
        raise ValueError(f"{len(scores)} scores for {len(tokens)} tokens (tokenizer.ggml.scores)")
    try:
        return models.BPE(vocab=text_to_id, merges=spm_merges(tokens, scores, text_to_id), byte_fallback=True,
                          fuse_unk=False)
    except Exception as error:  # tokenizers raises its own exception type
        raise ValueError(f"cannot build the SentencePiece model from the GGUF vocabulary: {error}") from error


def spm_normalizer(add_space_prefix: bool) -> normalizers.Normalizer:
    """Spaces -> U+2581 (llama_escape_whitespace); with add_space_prefix, one more before every
    fragment that starts the text or follows a special token, as llama.cpp adds ' '."""
    escape = normalizers.Replace(" ", SPACE)
    return normalizers.Sequence([normalizers.Prepend(SPACE), escape]) if add_space_prefix else escape


def spm_piece(text: str) -> bytes:
    """A normal token's bytes (llama_unescape_whitespace)."""
    return text.replace(SPACE, " ").encode("utf-8", "surrogateescape")
