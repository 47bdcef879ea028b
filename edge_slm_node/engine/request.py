"""One generation request and the events it streams."""
from __future__ import annotations

import enum
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..model.utf8_stream import Utf8StreamDecoder
from .constraint import HELD_BYTES as CONSTRAINT_HELD_BYTES
from .constraint import Constraint
from .llama_calls import ComputedCalls
from .sampling import Sampler, SamplingParams
from .stop_strings import StopStringMatcher


class FinishReason(str, enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    POOL_EXHAUSTED = "pool_exhausted"
    CONTEXT_FULL = "context_full"       # the answer reached max_context_tokens
    TOOL_CALLS = "tool_calls"           # the answer ended with a complete tool call
    ERROR = "error"


class RequestState(str, enum.Enum):
    QUEUED = "queued"
    PREFILL = "prefill"
    DECODE = "decode"
    FINISHED = "finished"


def held_bytes(text: str, params: SamplingParams, constraint: Optional[Constraint] = None) -> int:
    """What a waiting request's client-supplied strings and its constraint occupy in this process."""
    return (sys.getsizeof(text) + sum(sys.getsizeof(stop) for stop in params.stop)
            + sys.getsizeof(params.json_schema) + sys.getsizeof(params.grammar)
            + (CONSTRAINT_HELD_BYTES if constraint is not None else 0))


@dataclass
class TokenEvent:
    """A piece of streamed text; `finish_reason` is set on the request's last event only."""
    request: "Request"
    text: str
    finish_reason: Optional[FinishReason] = None
    error: str = ""


@dataclass
class Request:
    serial: int                      # the engine's own number (clients have their request_id)
    session_id: str
    text: str
    params: SamplingParams
    raw: bool
    on_event: Optional[Callable[[TokenEvent], None]]
    sampler: Sampler
    decoder: Utf8StreamDecoder
    stop_matcher: StopStringMatcher
    state: RequestState = RequestState.QUEUED
    prompt_ids: list = field(default_factory=list)      # full token list the turn is prefilled from
    generated_ids: list = field(default_factory=list)
    next_token: Optional[int] = None                    # sampled, KV not yet computed
    prefill_done: int = 0                               # tokens of prompt_ids already in KV
    cached_prompt_tokens: int = 0                       # found in KV when first admitted
    text_out: str = ""
    finish_reason: Optional[FinishReason] = None
    error: str = ""
    submitted_at: float = field(default_factory=time.monotonic)
    started_at: Optional[float] = None
    first_token_at: Optional[float] = None
    finished_at: Optional[float] = None
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    decode_steps: int = 0                               # forward passes that decoded one token
    preemptions: int = 0                                # KV freed for another request, recomputed later
    suspensions: int = 0                                # yielded its decode slot to a waiting request
    turn_steps: int = 0                                 # decode steps since its last admission
    kv_kept: bool = False                               # not running, yet its session's KV holds the turn
    events: list = field(default_factory=list)          # kept when on_event is None (sync use)
    held_bytes: int = 0                                 # memory its text and stop strings hold (queue budget)
    constraint: Optional[Constraint] = None             # masks its tokens (json_schema, grammar, tools)
    role: str = "user"                                  # its turn's role: user, or tool (a tool's result)
    tool_calls: list = field(default_factory=list)      # tools.ToolCall, when it ended with tool_calls
    calls: ComputedCalls = field(default_factory=ComputedCalls)   # its session's (llama_calls.py)

    @property
    def done(self) -> bool:
        return self.state is RequestState.FINISHED

    @property
    def ttft_ms(self) -> float:
        if self.first_token_at is None:
            return 0.0
        return (self.first_token_at - self.submitted_at) * 1000.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_steps / self.decode_seconds if self.decode_seconds > 0 else 0.0
