"""What one engine step does, as decided by the scheduler and carried out by the runner."""
from __future__ import annotations

from dataclasses import dataclass, field

from .request import FinishReason, Request


@dataclass
class PromptChunk:
    """Prompt tokens [start, start + count) of `request`, computed in this step."""
    request: Request
    start: int
    count: int

    @property
    def last(self) -> bool:
        """The prompt's last chunk: its logits give the first generated token."""
        return self.start + self.count == len(self.request.prompt_ids)

    @property
    def token_ids(self) -> list:
        return self.request.prompt_ids[self.start:self.start + self.count]


@dataclass
class Rejection:
    """A request the scheduler ends without running it further."""
    request: Request
    reason: FinishReason
    error: str


@dataclass
class StepPlan:
    """decode: one token each (their sampled next_token), oldest first; prompts: chunks in
    admission order; copies: copy-on-write (source block, destination block) to make before the
    forward pass; rejected: requests to finish now."""
    decode: list = field(default_factory=list)
    prompts: list = field(default_factory=list)
    copies: list = field(default_factory=list)
    rejected: list = field(default_factory=list)

    @property
    def runs_model(self) -> bool:
        return bool(self.decode or self.prompts)

    @property
    def requests(self) -> list:
        return self.decode + [chunk.request for chunk in self.prompts]
