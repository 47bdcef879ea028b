"""Constrained decoding: a request's output kept inside a JSON Schema or a grammar (llguidance).

One `ConstraintCompiler` per engine holds the llguidance tokenizer, built once (on the first
constrained request) from the GGUF's own token bytes, its control-token ids and its
end-of-generation ids; llguidance calls back into our tokenizer to tokenize bytes a grammar
forces. Each constrained request gets a `Constraint`: a matcher that, before every sample,
writes which tokens may come next into its bitmask (the logits of all others become -inf),
and that consumes every sampled token exactly once. Preemption and suspension never replay or
roll back tokens: a request's sampled tokens stay consumed, and its recompute only rebuilds KV.
"""
from __future__ import annotations

import threading
import time
from typing import Optional

import llguidance
import numpy as np

from ..kernels.token_mask import mask_logits
from ..model.tokenizer import Tokenizer
from .sampling import InvalidRequestError, SamplingParams

# JSON as models write it (Python's json.dumps separators); no free whitespace, so a model
# cannot pad an answer with newlines until max_new_tokens
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# what one matcher holds once it has computed masks (measured: ~1.0 MiB for a nested schema on
# SmolLM2); counted against max_queued_bytes while its request waits
HELD_BYTES = 1 << 20


class Constraint:
    """One request's constraint state; used by the engine thread only."""

    def __init__(self, matcher: "llguidance.LLMatcher", vocab_size: int, kind: str):
        self.matcher = matcher
        self.kind = kind                      # "json_schema", "grammar" or "tools"
        self.mask = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
        self.mask_seconds = 0.0               # time spent computing and applying masks (benchmarks)
        self.mask_calls = 0

    def mask_logits(self, logits: np.ndarray) -> bool:
        """Disallowed tokens' logits -> -inf (in place); False if the matcher failed (see .error)."""
        started = time.perf_counter()
        self.matcher.unsafe_compute_mask_ptr(self.mask.ctypes.data, self.mask.nbytes)
        ok = not self.matcher.is_error()
        if ok:
            mask_logits(logits, self.mask)
        self.mask_seconds += time.perf_counter() - started
        self.mask_calls += 1
        return ok

    def advance(self, token: int) -> bool:
        """Consume a sampled token; False if the grammar refused it (see .error)."""
        return self.matcher.consume_token(token)

    @property
    def complete(self) -> bool:
        """Nothing may follow: the structure is finished (only end-of-generation could come)."""
        return self.matcher.is_stopped() and not self.matcher.is_error()   # an error stops it too

    @property
    def error(self) -> str:
        return self.matcher.get_error()


class _TokenizerCallback:
    """What llguidance.TokenizerWrapper reads: token bytes, eos/bos, control ids, and encode."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.tokens = tokenizer.all_token_bytes()
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = sorted(tokenizer.special_ids)

    def __call__(self, data: bytes) -> list:
        return self.tokenizer.encode(data.decode("utf-8", "replace"), parse_special=False)


class ConstraintCompiler:
    """Grammar text -> Constraint, for one model. Thread-safe: called by submitting threads."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._llg_tokenizer: Optional["llguidance.LLTokenizer"] = None
        self._lock = threading.Lock()

    @property
    def llg_tokenizer(self) -> "llguidance.LLTokenizer":
        with self._lock:                      # built once, on first use (0.2-0.5 s, 17-48 MB)
            if self._llg_tokenizer is None:
                wrapper = llguidance.TokenizerWrapper(_TokenizerCallback(self.tokenizer))
                self._llg_tokenizer = llguidance.LLTokenizer(wrapper, eos_token=sorted(self.tokenizer.eog_ids))
            return self._llg_tokenizer

    def for_params(self, params: SamplingParams) -> Optional[Constraint]:
        """The constraint a request's json_schema or grammar asks for, or None.
        Raises InvalidRequestError with the parser's message."""
        if params.json_schema:
            try:
                grammar = llguidance.LLMatcher.grammar_from_json_schema(params.json_schema, overrides=JSON_OPTIONS)
            except ValueError as error:
                raise InvalidRequestError(f"invalid json_schema: {error}") from error
            return self.compile(grammar, "json_schema")
        if params.grammar:
            try:
                grammar = llguidance.grammar_from("grammar", params.grammar)   # Lark, or GBNF converted
            except ValueError as error:
                raise InvalidRequestError(f"invalid grammar: {error}") from error
            return self.compile(grammar, "grammar")
        return None

    @staticmethod
    def lark(text: str) -> str:
        """A Lark grammar written by the engine itself (tools) -> an llguidance grammar."""
        return llguidance.LLMatcher.grammar_from_lark(text)

    def compile(self, grammar: str, kind: str) -> Constraint:
        """An llguidance grammar (from grammar_from_*) -> a fresh Constraint."""
        llg_tokenizer = self.llg_tokenizer
        matcher = llguidance.LLMatcher(llg_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(f"invalid {kind}: {matcher.get_error()}")
        return Constraint(matcher, llg_tokenizer.vocab_size, kind)
