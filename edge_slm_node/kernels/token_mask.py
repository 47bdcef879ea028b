"""Applies a constrained-decoding token mask (llguidance's bitmask layout) to one logits row."""
import numpy as np
from numba import njit

_ALL_ALLOWED = np.int32(-1)


@njit(cache=True, nogil=True)
def mask_logits(logits, words):
    """logits (vocab,) f32, words (ceil(n/32),) i32: bit b of word w allows token 32*w + b;
    every other token's logit -> -inf, including ids beyond the mask. In place."""
    vocab = logits.shape[0]
    covered = min(vocab, words.shape[0] * 32)
    for w in range(words.shape[0]):
        word = words[w]
        if word == _ALL_ALLOWED:            # most words in free text: skip 32 tokens at once
            continue
        base = w * 32
        for b in range(min(32, covered - base)):
            if not (word >> b) & 1:
                logits[base + b] = -np.inf
    for i in range(covered, vocab):
        logits[i] = -np.inf
