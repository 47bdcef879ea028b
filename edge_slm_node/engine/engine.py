"""The inference engine: sessions, requests, and step() = schedule -> run the model -> postprocess.

Thread model: public methods may be called from any thread (they take the engine lock);
step() runs on one engine thread and releases the lock while the model computes, so calls
that touch a session inside the running forward pass wait for it to finish (one step) and
then look the session up again.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Callable, Iterator, Optional

from ..kv.arena import KVArena
from ..kv.block_manager import KVBlockManager
from ..model.buffers import GuardZones
from ..model.chat_prompt import ChatPrompt
from ..model.load_progress import LoadProgress
from ..model.loader import LoadedModel, load_model
from ..model.utf8_stream import Utf8StreamDecoder
from .config import ConfigError, EngineConfig
from .constraint import ConstraintCompiler
from .guard_check import GuardZoneError, guard_breach
from .memory_lock import lock_arrays
from .model_runner import ModelRunner
from .postprocess import Postprocessor
from .prefix_kv_cache import PrefixKVCache, cache_key, default_directory
from .prompts import PromptBuilder
from .request import FinishReason, Request, TokenEvent, held_bytes
from .sampling import InvalidRequestError, Sampler, SamplingParams
from .scheduler import PREFIX_SEQ_KEY, Scheduler
from .session import Session
from .session_table import SessionTable, UnknownSessionError
from .stats import EngineStats, SessionStats
from .stop_strings import StopStringMatcher
from .tools import ToolCatalog

log = logging.getLogger(__name__)

__all__ = ["Engine", "GuardZoneError", "UnknownSessionError"]


class Engine:
    def __init__(self, config: EngineConfig, model: Optional[LoadedModel] = None,
                 progress: Optional[LoadProgress] = None):
        """progress: told each loading stage (map, repack, tokenizer, KV pool and buffers, kernels,
        shared-prompt prefill)."""
        progress = progress or LoadProgress()
        self.config = config.validate()
        self.model = model or load_model(config.model_path, progress)
        mc = self.model.config
        self.tokenizer = self.model.tokenizer
        self.max_context = min(config.max_context_tokens, mc.context_length)
        self.tools = ToolCatalog(config.tools)
        if self.tools and "tools" not in self.model.chat_template.source:
            log.warning("%d tools configured, but the model's chat template has no `tools` variable: the model "
                        "is not shown them (calls are still constrained to them)", len(config.tools))
        self.prompts = PromptBuilder(ChatPrompt(self.model.chat_template, self.tokenizer, self.tools.template_tools()),
                                     self.tokenizer,
                                     self.max_context, drop_oldest=config.context_overflow == "drop_oldest")
        progress("KV pool and buffers", 0, 1)
        self.guards = GuardZones(config.guard_zones)
        self.arena = KVArena.from_megabytes(mc.num_layers, mc.num_kv_heads, mc.head_dim, config.kv_pool_mb,
                                            config.block_size, guard_rows=1 if config.guard_zones else 0)
        self.kv = KVBlockManager(self.arena.num_blocks, config.block_size, config.enable_prefix_cache)
        self.runner = ModelRunner(self.model, config, self.arena, self.max_context, self.guards)
        progress("KV pool and buffers", 1, 1)
        self.prefix_ids: list[int] = self.prompts.prefix(config.system_prompt) if config.system_prompt else []
        if len(self.prefix_ids) >= self.max_context:
            raise ConfigError(f"system prompt is {len(self.prefix_ids)} tokens; max_context_tokens="
                              f"{self.max_context} leaves no room for a conversation")
        self.sessions = SessionTable(config, self.max_context, self.prompts, self.prefix_ids)
        self.scheduler = Scheduler(config, self.kv, self.sessions.by_id, self.max_context, self.prompts.build,
                                   self.prefix_ids)
        self.constraints = ConstraintCompiler(self.tokenizer)
        self._tools_grammar = self.constraints.lark(self.tools.lark_grammar()) if self.tools else None
        self.post = Postprocessor(self.kv, self.tokenizer, self.sessions.by_id, self.scheduler, self.max_context)
        self._ids = itertools.count(1)
        self.steps = 0                          # steps that ran the model
        self._lock = threading.RLock()
        self._forward_done = threading.Condition(self._lock)
        self._in_forward: set[str] = set()
        self._calls_waiting = 0                 # session calls waiting for a forward pass to end
        progress("kernels", 0, 1)               # loaded from numba's cache by their first calls
        self.runner.warm_up(self.kv)
        progress("kernels", 1, 1)
        self.prefix_from_cache = False
        if self.prefix_ids:                     # computed once, its full blocks pinned for the engine's life
            self._compute_prefix(progress)
            self.kv.pin_sequence(PREFIX_SEQ_KEY)
        # after the prefix prefill: every buffer a step uses exists now
        self.locked_bytes = lock_arrays(self.runner.resident_arrays()) if config.lock_memory else 0
        progress.finish()

    def _compute_prefix(self, progress) -> None:
        """The shared prompt's KV: from the prefix KV cache file when it matches, else prefilled
        (and the file written)."""
        self.kv.allocate_prompt(PREFIX_SEQ_KEY, self.prefix_ids)
        blocks = self.kv.block_table(PREFIX_SEQ_KEY)
        count = len(self.prefix_ids)
        cache = None
        if self.config.prefix_kv_cache:
            cache = PrefixKVCache(self.config.prefix_kv_cache_dir or default_directory(),
                                  cache_key(self.model.path, self.prefix_ids, self.arena.storage.shape))
            if cache.load(self.arena.storage, blocks):
                self.kv.commit(PREFIX_SEQ_KEY, self.prefix_ids)
                self.prefix_from_cache = True
                log.info("shared prompt (%d tokens): KV read from %s", count, cache.path)
                progress("shared-prompt prefill", count, count, "tokens")
                return
        progress("shared-prompt prefill", 0, count, "tokens")
        self.runner.prefill(self.kv, PREFIX_SEQ_KEY, self.prefix_ids,
                            lambda done: progress("shared-prompt prefill", done, count, "tokens"))
        if cache is not None and cache.save(self.arena.storage, blocks) is None:
            log.info("shared prompt (%d tokens): KV written to %s", count, cache.path)

    # ---- the step ------------------------------------------------------------------------
    def step(self) -> bool:
        """One scheduling round; -> whether the model ran."""
        with self._lock:
            while self._calls_waiting:          # they go first, or a busy session would starve them
                self._forward_done.wait()
            plan = self.scheduler.schedule()
            for rejected in plan.rejected:
                self.post.finish(rejected.request, rejected.reason, rejected.error)
            if not plan.runs_model:
                return bool(plan.rejected)
            self._in_forward.update(r.session_id for r in plan.requests)
        started = time.monotonic()
        self.steps += 1
        try:
            logits, error = self.runner.run(plan, self.kv), None
        except Exception as failure:            # a kernel failure must not take the node down
            logits, error = None, f"{type(failure).__name__}: {failure}"
        breach = guard_breach(self.guards, self.arena, self.runner.blocks_written(plan.copies), self.steps,
                              self.runner.last_run) if self.guards.enabled else ""
        if breach:                              # the step's requests end with it, then the engine stops
            error = breach
        with self._lock:
            self._in_forward.clear()
            self._forward_done.notify_all()
            if error is not None:
                log.error("forward pass failed: %s", error)
                for request in plan.requests:
                    self.post.finish(request, FinishReason.ERROR, f"forward pass failed: {error}")
            else:
                self.post.apply(plan, logits, time.monotonic() - started)
        if breach:
            raise GuardZoneError(breach)
        return True

    def close(self) -> None:
        """End the side forward threads, so that dropping the engine frees weights, KV pool and
        buffers (a running thread would keep its Transformer). Steps after close run on one thread."""
        with self._lock:
            self.runner.close()

    # ---- requests ------------------------------------------------------------------------
    def submit(self, session_id: str, text: str, params: SamplingParams, raw: bool = False,
               on_event: Optional[Callable[[TokenEvent], None]] = None,
               create_if_missing: bool = False, owner_key: str = "", role: str = "user") -> Request:
        """Queue a turn. Raises InvalidRequestError / UnknownSessionError before queueing.

        create_if_missing: an unknown session is created (with the shared prompt) in the same
        locked step, after the request has been validated, so a rejected first command leaves
        nothing behind and no other call can see the session without its request."""
        params = params.validate(self.config.max_new_tokens_limit)
        constraint = self.constraints.for_params(params)    # compiled outside the lock (GIL-free, ~1 ms)
        if constraint is None and self._tools_grammar is not None and not raw:
            constraint = self.constraints.compile(self._tools_grammar, "tools")
        with self._lock:
            if not isinstance(text, str) or not text.strip():
                raise InvalidRequestError("empty prompt: text has no non-whitespace character")
            if len(text) > self.config.max_input_chars:
                raise InvalidRequestError(f"prompt has {len(text)} characters, limit max_input_chars={self.config.max_input_chars}")
            session = self.sessions.get(session_id)
            queue = self.scheduler.queue
            # a quarter of the queue is kept for owned sessions: a flood of anonymous commands
            # (new session ids, no key) cannot lock an operator out
            owned = bool(session.owner_key) if session is not None else bool(owner_key)
            limit = self.config.max_queued_requests if owned else max(1, self.config.max_queued_requests * 3 // 4)
            if len(queue) >= limit:
                held = "" if owned else " for sessions without an owner_key"
                raise InvalidRequestError(f"engine queue full{held} ({len(queue)} requests waiting, "
                                          f"max_queued_requests={self.config.max_queued_requests})")
            cost = held_bytes(text, params, constraint)
            held = sum(r.held_bytes for r in queue)
            if held + cost > self.config.max_queued_bytes:
                raise InvalidRequestError(f"queued requests hold {held} bytes and this one {cost}; limit "
                                          f"max_queued_bytes={self.config.max_queued_bytes}")
            if session is None and create_if_missing:
                session = self._create(session_id, None, True, owner_key, auto_created=True)
            elif session is None:
                raise UnknownSessionError(f"unknown session {session_id!r}")
            session.authorize(owner_key)
            pending = len(self.scheduler.queued(session_id))
            if pending >= self.config.max_pending_per_session:
                raise InvalidRequestError(f"session {session_id!r} has {pending} queued requests "
                                          f"(max_pending_per_session={self.config.max_pending_per_session})")
            request = Request(next(self._ids), session_id, text, params, raw, on_event,
                              Sampler(params), Utf8StreamDecoder(self.tokenizer), StopStringMatcher(params.stop),
                              held_bytes=cost, constraint=constraint, role=role, calls=session.calls)
            self.scheduler.add(request)
            session.touch()
            return request

    def submit_tool_result(self, session_id: str, call_id: str, content: str, params: SamplingParams,
                           on_event: Optional[Callable[[TokenEvent], None]] = None, owner_key: str = "") -> Request:
        """Queue a tool's result as the session's next turn (role tool); the answer continues from it.
        Raises InvalidRequestError when the session has no such pending call."""
        with self._lock:
            session = self.sessions.lookup(session_id)
            session.authorize(owner_key)
            if call_id not in session.pending_tool_calls:
                pending = ", ".join(sorted(session.pending_tool_calls)) or "none"
                raise InvalidRequestError(f"session {session_id!r} has no pending tool call {call_id[:64]!r} "
                                          f"(pending: {pending})")
            request = self.submit(session_id, content, params, on_event=on_event, owner_key=owner_key, role="tool")
            del session.pending_tool_calls[call_id]
            return request

    def generate(self, session_id: str, text: str, params: SamplingParams, raw: bool = False) -> Iterator[str]:
        """Synchronous helper: submit, step until done, yield text pieces. Sets request on .last_request."""
        request = self.submit(session_id, text, params, raw)
        self.last_request = request
        while True:
            while request.events:
                event = request.events.pop(0)
                if event.text:
                    yield event.text
                if event.finish_reason is not None:
                    return
            self.step()

    # ---- sessions ------------------------------------------------------------------------
    def create_session(self, session_id: str = "", system_prompt: Optional[str] = None,
                       keep_history: bool = True, owner_key: str = "") -> Session:
        """system_prompt None = the engine's shared prompt; "" = no system message. At
        max_sessions the cheapest idle session is evicted (session.eviction_victim)."""
        with self._lock:
            return self._create(session_id, system_prompt, keep_history, owner_key, auto_created=False)

    def _create(self, session_id, system_prompt, keep_history, owner_key, auto_created) -> Session:
        session, victim = self.sessions.prepare(session_id, system_prompt, keep_history, owner_key, auto_created,
                                                self._idle)
        if victim is not None:
            freed = self._destroy(victim)
            self.sessions.evicted += 1
            log.info("session %r evicted for %r (max_sessions=%d reached; it was idle %.0f s, %s, %d blocks freed)",
                     victim.session_id, session.session_id, self.config.max_sessions,
                     time.monotonic() - victim.last_used,
                     "owned" if victim.owner_key else ("auto-created" if victim.auto_created else "created"), freed)
        return self.sessions.add(session)

    def _idle(self, session: Session) -> bool:
        return not self.scheduler.busy(session.session_id) and session.session_id not in self._in_forward

    def destroy_session(self, session_id: str, owner_key: str = "") -> int:
        """Cancel its requests, return every block; -> blocks returned to the pool."""
        with self._lock:
            return self._destroy(self._settled_session(session_id, owner_key))

    def _destroy(self, session: Session) -> int:
        available = self.kv.pool.num_available
        self._cancel_all(session, "session destroyed")
        if self.kv.has_seq(session.session_id):
            self.kv.free(session.session_id)
        self.sessions.remove(session.session_id)
        return self.kv.pool.num_available - available

    def reset_session(self, session_id: str, owner_key: str = "") -> int:
        """Forget the conversation, keep the system prompt; -> blocks returned to the pool."""
        with self._lock:
            session = self._settled_session(session_id, owner_key)
            available = self.kv.pool.num_available
            self._cancel_all(session, "session reset")
            session.messages.clear()
            session.pending_tool_calls.clear()
            if self.kv.has_seq(session_id):
                self.kv.truncate(session_id, min(len(session.prefix_ids), self.kv.num_tokens(session_id)))
                session.calls.truncate(len(session.prefix_ids))
            session.touch()
            return self.kv.pool.num_available - available

    def cancel(self, session_id: str, owner_key: str = "") -> bool:
        """Cancel the session's running and queued requests; -> whether there was any."""
        with self._lock:
            return self._cancel_all(self._settled_session(session_id, owner_key), "cancelled by client") > 0

    def expire_idle_sessions(self, idle_timeout_s: float, auto_idle_timeout_s: float) -> list:
        """Destroy every session idle (nothing queued or running) for longer than its timeout
        (auto-created sessions: auto_idle_timeout_s; 0 = never); -> [(session_id, idle s, blocks
        freed)]. Checked and destroyed under one lock hold: a command arriving meanwhile is never
        cancelled by it."""
        with self._lock:
            return [(s.session_id, idle, self._destroy(s))
                    for s, idle in self.sessions.expired(idle_timeout_s, auto_idle_timeout_s, self._idle)]

    def _settled_session(self, session_id: str, owner_key: str) -> Session:
        """The session, once no forward pass is computing it; call with the lock held.

        Waiting releases the lock, so the session is looked up (and its owner checked) again
        after every wait: it may have been destroyed, or re-created under the same id, meanwhile."""
        while True:
            session = self.sessions.lookup(session_id)
            session.authorize(owner_key)
            if session_id not in self._in_forward:
                return session
            self._calls_waiting += 1
            try:
                self._forward_done.wait()
            finally:
                self._calls_waiting -= 1
                self._forward_done.notify_all()

    def _cancel_all(self, session: Session, why: str) -> int:
        active = self.scheduler.active(session.session_id)
        victims = self.scheduler.queued(session.session_id) + ([active] if active else [])
        for request in victims:
            self.post.finish(request, FinishReason.CANCELLED, why)
        return len(victims)

    # ---- statistics ----------------------------------------------------------------------
    def stats(self) -> EngineStats:
        with self._lock:
            kv = self.kv.stats()
            sessions = []
            for s in self.sessions.by_id.values():
                active = self.scheduler.active(s.session_id)
                state = active.state.value if active else ("queued" if self.scheduler.busy(s.session_id) else "idle")
                has = self.kv.has_seq(s.session_id)
                sessions.append(SessionStats(
                    s.session_id, self.kv.num_tokens(s.session_id) if has else 0,
                    self.kv.num_blocks(s.session_id) if has else 0,
                    self.kv.num_shared_blocks(s.session_id) if has else 0, state, bool(s.owner_key),
                    s.auto_created))
            return EngineStats(
                block_size=self.config.block_size, bytes_per_block=self.arena.bytes_per_block,
                bytes_per_token=self.arena.bytes_per_token, total_blocks=kv.total_blocks,
                free_blocks=kv.free_blocks, cached_blocks=kv.cached_blocks, used_blocks=kv.used_blocks,
                pinned_blocks=kv.pinned_blocks, shared_blocks=kv.shared_blocks,
                prefix_query_tokens=kv.prefix_query_tokens, prefix_hit_tokens=kv.prefix_hit_tokens,
                evictions=kv.evictions, preemptions=self.scheduler.preemptions,
                queue_length=len(self.scheduler.queue), running=len(self.scheduler.running),
                weights_bytes=self.model.weights.num_bytes, arena_bytes=self.arena.num_bytes,
                locked_bytes=self.locked_bytes, sessions_evicted=self.sessions.evicted, sessions=sessions)
