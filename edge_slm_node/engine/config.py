"""Engine configuration: one frozen, validated dataclass built from config/*.yaml or the CLI."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


class ConfigError(ValueError):
    """A configuration value is out of range; the message names the parameter."""


CONTEXT_OVERFLOW_POLICIES = ("drop_oldest", "error")


@dataclass(frozen=True)
class EngineConfig:
    model_path: str = ""                 # path or known model name; empty = bundled SmolLM2-135M-Instruct Q4_1
    kv_pool_mb: float = 64.0             # size of the one KV arena
    block_size: int = 16                 # tokens per KV block
    max_sessions: int = 16
    max_context_tokens: int = 2048       # per session: system prompt + history + answer
    max_batch_tokens: int = 128          # tokens per forward step (prefill chunk + decodes)
    max_running: int = 8                 # sequences decoding at once
    max_new_tokens_limit: int = 2048
    max_input_chars: int = 16384
    system_prompt: Optional[str] = None  # shared, pinned prefix; None = no default system prompt
    enable_prefix_cache: bool = True
    max_queued_requests: int = 64
    queue_timeout_s: float = 30.0
    max_pending_per_session: int = 8
    max_queued_bytes: int = 16 * 2**20   # memory all queued requests' text and stop strings may hold
    num_threads: int = 2
    fair_share_steps: int = 16           # while a resumed request waits for a decode slot, one that decoded
                                         # this many steps since admission yields it (keeping its KV); to a
                                         # request without its first token yet, one step is enough
    context_overflow: str = "drop_oldest"  # a turn that does not fit: drop_oldest turns, or error
    lock_memory: bool = False            # mlock weights, KV arena and buffers (engine/memory_lock.py)
    guard_zones: bool = False            # debug: canaries after every KV tile and buffer, checked every step
    prefix_kv_cache: bool = False        # keep the shared prompt's KV on disk: a restart skips its prefill
    prefix_kv_cache_dir: str = ""        # its folder; empty = $EDGE_SLM_PREFIX_KV_DIR or ~/.cache/edge_slm_node/prefix_kv
    tools: tuple = ()                    # engine.tools.Tool declarations shown to the model; () = none

    def validate(self) -> "EngineConfig":
        checks = [
            ("kv_pool_mb", self.kv_pool_mb > 0, "must be > 0"),
            ("block_size", self.block_size in (8, 16, 32, 64), "must be 8, 16, 32 or 64"),
            ("max_sessions", 1 <= self.max_sessions <= 1024, "must be in [1, 1024]"),
            ("max_context_tokens", 16 <= self.max_context_tokens <= 32768, "must be in [16, 32768]"),
            ("max_batch_tokens", 1 <= self.max_batch_tokens <= 4096, "must be in [1, 4096]"),
            ("max_running", 1 <= self.max_running <= min(self.max_batch_tokens, 256),
             "must be in [1, min(max_batch_tokens, 256)]"),
            ("max_new_tokens_limit", self.max_new_tokens_limit >= 1, "must be >= 1"),
            ("max_input_chars", self.max_input_chars >= 1, "must be >= 1"),
            ("max_queued_requests", self.max_queued_requests >= 1, "must be >= 1"),
            ("queue_timeout_s", self.queue_timeout_s > 0, "must be > 0"),
            ("max_pending_per_session", self.max_pending_per_session >= 1, "must be >= 1"),
            ("max_queued_bytes", self.max_queued_bytes >= 2**16, "must be >= 64 KiB"),
            ("num_threads", 1 <= self.num_threads <= 256, "must be in [1, 256]"),
            ("fair_share_steps", self.fair_share_steps >= 1, "must be >= 1"),
            ("context_overflow", self.context_overflow in CONTEXT_OVERFLOW_POLICIES,
             f"must be one of {', '.join(CONTEXT_OVERFLOW_POLICIES)}"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ConfigError(f"parameter {name}={getattr(self, name)!r} {rule}")
        return self
