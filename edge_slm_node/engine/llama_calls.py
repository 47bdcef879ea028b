"""Which llama.cpp call would compute each of a session's tokens if the session ran alone.

llama.cpp evaluates a turn's new prompt tokens as one batch, in micro-batches of
LLAMA_CPP_UBATCH, and each generated token as a call of its own; its attention and K-quant
matmuls sum a token in an order that depends on the size of that call. The engine gives every
token the shape (index in the call, call length) of that call, so the kernels sum it the same
way whether its prompt is chunked, batched with other sessions' tokens, or recomputed after a
preemption. A session remembers the prompt calls its KV was computed in (ComputedCalls); a
position in none of them was decoded.
"""
from __future__ import annotations

from dataclasses import dataclass

LLAMA_CPP_UBATCH = 512   # llama.cpp evaluates a prompt in micro-batches of this many tokens
DECODED = (0, 1)         # the shape of a generated token's call


def call_shape(index: int, num_new_tokens: int) -> tuple:
    """-> (index in its micro-batch, micro-batch length) of new prompt token `index` of a call of
    num_new_tokens."""
    first = index // LLAMA_CPP_UBATCH * LLAMA_CPP_UBATCH
    return index - first, min(LLAMA_CPP_UBATCH, num_new_tokens - first)


@dataclass
class _PromptCall:
    start: int           # positions [start, end) were one call
    end: int
    valid_end: int       # positions from here on were truncated since (computed anew, by a later call or decode)


class ComputedCalls:
    """One session's prompt calls, oldest first."""

    def __init__(self):
        self._calls: list[_PromptCall] = []

    def __len__(self) -> int:
        return len(self._calls)

    def record(self, start: int, end: int) -> None:
        """Positions [start, end) are (to be) computed as one prompt call."""
        if end > start:
            self._calls.append(_PromptCall(start, end, end))

    def truncate(self, length: int) -> None:
        """The KV keeps positions [0, length) only: later ones will be computed anew."""
        self._calls = [c for c in self._calls if c.start < length]
        for c in self._calls:
            c.valid_end = min(c.valid_end, length)

    def shape(self, position: int) -> tuple:
        """-> (index, length) of the call that computed (or will compute) position."""
        for c in reversed(self._calls):
            if c.start <= position < c.valid_end:
                return call_shape(position - c.start, c.end - c.start)
        return DECODED

    def shapes(self, start: int, count: int) -> tuple:
        """-> (indexes, lengths) of positions [start, start + count)."""
        pairs = [self.shape(p) for p in range(start, start + count)]
        return [i for i, _ in pairs], [n for _, n in pairs]
