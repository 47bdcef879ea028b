"""Sampling parameters (validated at the boundary) and the token sampler."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np


# Stop strings are matched against every decoded piece and held while a request waits: bounded.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_STOP_TOTAL_CHARS = 1024
# A JSON Schema or grammar is compiled when submitted and held while the request waits: bounded.
MAX_CONSTRAINT_CHARS = 16384


class InvalidRequestError(ValueError):
    """A client asked for something impossible; the message names the value and the limit."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0          # 0 = greedy
    top_k: int = 0                    # 0 = whole vocabulary
    top_p: float = 1.0                # 1 = no nucleus cut
    repetition_penalty: float = 1.0   # 1 = off; applied to tokens already generated in this request
    seed: Optional[int] = None        # None = random
    max_new_tokens: int = 256
    stop: tuple = field(default_factory=tuple)   # stop strings, not included in the output
    ignore_eos: bool = False
    json_schema: str = ""             # the output must validate against this JSON Schema; "" = free
    grammar: str = ""                 # the output must match this Lark or GBNF grammar; "" = free

    def validate(self, max_new_tokens_limit: int) -> "SamplingParams":
        def bad(name, value, rule):
            raise InvalidRequestError(f"invalid {name}={value!r}: {rule}")
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)) or self.temperature < 0:
            bad("temperature", self.temperature, "must be a finite number >= 0 (0 = greedy)")
        if self.temperature > 100:
            bad("temperature", self.temperature, "must be <= 100")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            bad("top_k", self.top_k, "must be an integer >= 0 (0 = off)")
        if not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", self.top_p, "must be in (0, 1]")
        if not math.isfinite(self.repetition_penalty) or not 0 < self.repetition_penalty <= 10:
            bad("repetition_penalty", self.repetition_penalty, "must be in (0, 10]")
        if self.seed is not None and not 0 <= self.seed < 2 ** 63:
            bad("seed", self.seed, "must be in [0, 2^63) or None for random")
        if int(self.max_new_tokens) != self.max_new_tokens or not 1 <= self.max_new_tokens <= max_new_tokens_limit:
            bad("max_new_tokens", self.max_new_tokens, f"must be an integer in [1, {max_new_tokens_limit}]")
        if len(self.stop) > MAX_STOP_STRINGS:
            bad("stop", f"{len(self.stop)} strings", f"at most {MAX_STOP_STRINGS} stop strings")
        for stop in self.stop:
            if not isinstance(stop, str) or not stop:
                bad("stop", stop[:40] if isinstance(stop, str) else stop, "stop strings must be non-empty strings")
            if len(stop) > MAX_STOP_CHARS:
                bad("stop", stop[:40] + "...", f"a stop string has {len(stop)} characters, at most {MAX_STOP_CHARS}")
        total = sum(len(stop) for stop in self.stop)
        if total > MAX_STOP_TOTAL_CHARS:
            bad("stop", f"{len(self.stop)} strings", f"{total} characters in all, at most {MAX_STOP_TOTAL_CHARS}")
        for name in ("json_schema", "grammar"):
            value = getattr(self, name)
            if not isinstance(value, str):
                bad(name, type(value).__name__, "must be a string ('' = unconstrained)")
            if len(value) > MAX_CONSTRAINT_CHARS:
                bad(name, value[:40] + "...", f"has {len(value)} characters, at most {MAX_CONSTRAINT_CHARS}")
        if self.json_schema and self.grammar:
            bad("grammar", self.grammar[:40], "give json_schema or grammar, not both")
        return self


class Sampler:
    """Picks the next token from logits; owns its random generator so a seed replays exactly."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def sample(self, logits: np.ndarray, previous_tokens: list) -> int:
        """logits (vocab,) f32 (modified in place by the repetition penalty) -> token id."""
        p = self.params
        if p.repetition_penalty != 1.0 and previous_tokens:
            seen = np.unique(np.asarray(previous_tokens, dtype=np.int64))
            values = logits[seen]
            logits[seen] = np.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
        if p.temperature == 0:
            return int(np.argmax(logits))
        candidates = np.arange(logits.shape[0]) if p.top_k == 0 else None
        if p.top_k:
            k = min(p.top_k, logits.shape[0])
            candidates = np.argpartition(logits, -k)[-k:]
        scaled = logits[candidates].astype(np.float64) / p.temperature
        order = np.argsort(-scaled, kind="stable")
        candidates, scaled = candidates[order], scaled[order]
        probs = np.exp(scaled - scaled[0])
        probs /= probs.sum()
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
            candidates, probs = candidates[:keep], probs[:keep] / probs[:keep].sum()
        return int(candidates[self.rng.choice(len(candidates), p=probs)])
