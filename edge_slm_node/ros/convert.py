"""Messages <-> engine values. No numerics, no block logic."""
from __future__ import annotations

import re
from dataclasses import replace

from edge_slm_node.msg import PoolStatus, SessionStatus, TokenChunk

from ..engine.sampling import InvalidRequestError, SamplingParams

SESSION_ID_PATTERN = re.compile(r"[A-Za-z0-9_.:@\-]{1,128}")


def check_session_id(session_id: str) -> str:
    if not session_id:
        raise InvalidRequestError("session_id is empty")
    if not SESSION_ID_PATTERN.fullmatch(session_id):
        shown = session_id[:40] + ("..." if len(session_id) > 40 else "")
        raise InvalidRequestError(f"session_id {shown!r} ({len(session_id)} chars) is invalid: use 1-128 of "
                                  f"A-Z a-z 0-9 _ . : @ -")
    return session_id


def sampling_from_command(command, defaults: SamplingParams) -> SamplingParams:
    """Command fields with their 'use the node default' sentinels -> SamplingParams."""
    return replace(
        defaults,
        max_new_tokens=command.max_new_tokens or defaults.max_new_tokens,
        temperature=defaults.temperature if command.temperature < 0 else float(command.temperature),
        top_k=command.top_k or defaults.top_k,
        top_p=defaults.top_p if command.top_p <= 0 else float(command.top_p),
        seed=None if command.seed < 0 else int(command.seed),
        stop=tuple(command.stop),
        json_schema=command.json_schema,
        grammar=command.grammar,
    )


def token_chunk(session_id: str, request_id: int, seq: int, text: str, request=None,
                finish_reason: str = "", error: str = "") -> TokenChunk:
    chunk = TokenChunk(session_id=session_id, request_id=request_id, seq=seq, text=text)
    if finish_reason:
        chunk.done = True
        chunk.finish_reason = finish_reason
        chunk.error = error
    if request is not None:
        chunk.prompt_tokens = len(request.prompt_ids)
        chunk.cached_prompt_tokens = request.cached_prompt_tokens
        chunk.completion_tokens = len(request.generated_ids)
        chunk.ttft_ms = float(request.ttft_ms)
        chunk.decode_tokens_per_s = float(request.decode_tokens_per_s)
    return chunk


def pool_status(stats, stamp, rss_bytes: int) -> PoolStatus:
    message = PoolStatus(
        stamp=stamp, block_size=stats.block_size, bytes_per_block=stats.bytes_per_block,
        total_blocks=stats.total_blocks, free_blocks=stats.free_blocks, used_blocks=stats.used_blocks,
        shared_blocks=stats.shared_blocks, cached_blocks=stats.cached_blocks,
        usage_ratio=float(stats.usage_ratio), kv_bytes_in_use=stats.kv_bytes_in_use,
        prefix_query_tokens=stats.prefix_query_tokens, prefix_hit_tokens=stats.prefix_hit_tokens,
        preemptions=stats.preemptions, queue_length=stats.queue_length, rss_bytes=rss_bytes,
        weights_bytes=stats.weights_bytes, sessions_evicted=stats.sessions_evicted)
    message.sessions = [SessionStatus(session_id=s.session_id, num_tokens=s.num_tokens, num_blocks=s.num_blocks,
                                      shared_blocks=s.shared_blocks, state=s.state, owned=s.owned,
                                      auto_created=s.auto_created) for s in stats.sessions]
    return message
