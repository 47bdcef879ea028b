"""Memory budget at start: refuse to start (with every figure) rather than be OOM-killed later."""
from __future__ import annotations

import os
from dataclasses import replace

from ..engine.memory import mem_available_bytes, resident_bytes
from ..kv.arena import bytes_per_token
from ..model.config import ModelConfig
from ..model.gguf_file import GGUFFile

RUNTIME_MARGIN_BYTES = 96 * 2**20      # numba JIT, activation buffers, rclpy queues beyond the current RSS
# the tokenizer and the GGUF's token lists per vocabulary entry: measured 115 MiB for Qwen2.5's
# 151,936 entries (README "Models"), 130 MiB for Gemma 3's 262,144 (this reserves 206)
TOKENIZER_BYTES_PER_ENTRY = 800
MIB = 2**20


class MemoryBudgetError(RuntimeError):
    pass


def check_memory_budget(settings, model_path: str, logger=None, available: int | None = None):
    """-> EngineConfig whose weights + KV pool + runtime fit in
    MemAvailable * min(memory_cap_fraction, 1 - memory_reserve_fraction); sizes the pool when kv_pool_mb = 0."""
    engine = settings.engine
    available = mem_available_bytes() if available is None else available
    allowed = int(available * min(settings.memory_cap_fraction, 1.0 - settings.memory_reserve_fraction))
    weights = os.path.getsize(model_path)
    model = ModelConfig.from_gguf(GGUFFile(model_path))
    runtime = resident_bytes() + RUNTIME_MARGIN_BYTES + model.vocab_size * TOKENIZER_BYTES_PER_ENTRY
    per_token = bytes_per_token(model.num_layers, model.num_kv_heads, model.head_dim)
    per_block = per_token * engine.block_size
    if settings.kv_pool_auto:
        useful = engine.max_sessions * engine.max_context_tokens * per_token
        kv_bytes = min(allowed - weights - runtime, useful)
        if kv_bytes < per_block:
            raise MemoryBudgetError(_figures("no room for a KV pool", available, allowed, weights, 0, runtime,
                                             settings))
        engine = replace(engine, kv_pool_mb=kv_bytes / MIB)
    kv_bytes = int(engine.kv_pool_mb * MIB) // per_block * per_block
    total = weights + kv_bytes + runtime
    if total > allowed:
        raise MemoryBudgetError(_figures("memory budget exceeded", available, allowed, weights, kv_bytes, runtime,
                                         settings))
    if logger is not None:
        logger.info(_figures("memory budget ok", available, allowed, weights, kv_bytes, runtime, settings))
    # what queued requests may hold: an eighth of the headroom left, within [1, 64] MiB
    queue_bytes = min(64 * MIB, max(MIB, (allowed - total) // 8))
    return replace(engine, max_queued_bytes=int(queue_bytes))


def _figures(verdict, available, allowed, weights, kv_bytes, runtime, settings) -> str:
    return (f"{verdict}: weights {weights / MIB:.1f} MiB + KV pool {kv_bytes / MIB:.1f} MiB + runtime "
            f"{runtime / MIB:.1f} MiB = {(weights + kv_bytes + runtime) / MIB:.1f} MiB; allowed "
            f"{allowed / MIB:.1f} MiB = MemAvailable {available / MIB:.1f} MiB x min(memory_cap_fraction "
            f"{settings.memory_cap_fraction:g}, 1 - memory_reserve_fraction {settings.memory_reserve_fraction:g}); "
            f"runtime = resident now + {RUNTIME_MARGIN_BYTES // MIB} MiB + the vocabulary's tokenizer")
