"""The inference engine: sessions, a FIFO of requests, and step() = schedule -> forward -> sample.

Thread model: public methods may be called from any thread (they take the engine lock);
step() runs on one engine thread and releases the lock while the model computes, so calls
that touch a sequence inside the running forward wait for it to finish (one step).
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections import deque
from typing import Callable, Iterator, Optional

import numba

from ..kv.arena import KVArena
from ..kv.block_manager import KVBlockManager
from ..model.chat_prompt import ChatPrompt
from ..model.loader import LoadedModel, load_model
from ..model.transformer import Transformer
from ..model.utf8_stream import Utf8StreamDecoder
from .batch import BatchBuilder
from .config import ConfigError, EngineConfig
from .memory_lock import lock_arrays
from .request import FinishReason, Request, TokenEvent, held_bytes
from .sampling import InvalidRequestError, Sampler, SamplingParams
from .scheduler import PREFIX_SEQ_KEY, Scheduler
from .side_forward import SideForward
from .session import Session, eviction_victim
from .stop_strings import StopStringMatcher
from .stats import EngineStats, SessionStats


log = logging.getLogger(__name__)
MAX_OWNER_KEY_CHARS = 256


class UnknownSessionError(KeyError):
    def __str__(self):
        return self.args[0]


class Engine:
    def __init__(self, config: EngineConfig, model: Optional[LoadedModel] = None):
        self.config = config.validate()
        self.pool_threads = min(config.num_threads, numba.config.NUMBA_NUM_THREADS)
        numba.set_num_threads(self.pool_threads)
        self.model = model or load_model(config.model_path)
        mc = self.model.config
        self.tokenizer = self.model.tokenizer
        self.chat_prompt = ChatPrompt(self.model.chat_template, self.tokenizer)
        self.max_context = min(config.max_context_tokens, mc.context_length)
        self.arena = KVArena.from_megabytes(mc, config.kv_pool_mb, config.block_size)
        self.kv = KVBlockManager(self.arena.num_blocks, config.block_size, config.enable_prefix_cache)
        self.transformer = Transformer(mc, self.model.weights, config.max_batch_tokens, self.max_context,
                                       max_logits_rows=config.max_running + 1)
        max_blocks = -(-self.max_context // config.block_size)
        self.batch = BatchBuilder(config.max_batch_tokens, config.max_running + 1, max_blocks)
        # Decode-only steps of 2+ sequences can be split over num_threads threads, each running a
        # whole forward on its part on one thread: one hand-off per step instead of a thread-pool
        # wake-up per matmul (decode_policy.py decides per step).
        self.sides: list[SideForward] = []
        if config.max_running >= 2 and self.transformer.runs_single_threaded:
            self.sides = [SideForward(Transformer(mc, self.model.weights, config.max_running, self.max_context,
                                                  max_logits_rows=config.max_running),
                                      BatchBuilder(config.max_running, config.max_running, max_blocks))
                          for _ in range(config.num_threads - 1)]
        self.sessions: dict[str, Session] = {}
        self.queue: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0
        self.sessions_evicted = 0
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._forward_done = threading.Condition(self._lock)
        self._in_forward: set[str] = set()
        self.prefix_ids: list[int] = []
        self.scheduler = Scheduler(self)
        if config.system_prompt:
            self.prefix_ids = self.render_prefix(config.system_prompt)
            if len(self.prefix_ids) >= self.max_context:
                raise ConfigError(f"system prompt is {len(self.prefix_ids)} tokens; max_context_tokens="
                                  f"{self.max_context} leaves no room for a conversation")
            self.scheduler.prefill_shared_prefix(PREFIX_SEQ_KEY, self.prefix_ids)
        self.scheduler.warm_up_decode()
        # after the prefix prefill: every buffer a step uses exists now
        self.locked_bytes = lock_arrays(self.resident_arrays()) if config.lock_memory else 0

    def resident_arrays(self) -> list:
        """Weights, KV arena and every activation buffer (what lock_memory pins in RAM)."""
        sides = [a for side in self.sides for a in side.transformer.resident_arrays()]
        return self.transformer.resident_arrays() + sides + [self.arena.storage]

    # ---- prompts -------------------------------------------------------------------------
    def render_prefix(self, system_prompt: str) -> list[int]:
        return self.chat_prompt.ids([{"role": "system", "content": system_prompt}], add_generation_prompt=False)

    def render_turn(self, session: Session, text: str) -> list[int]:
        messages = list(session.messages) + [{"role": "user", "content": text}]
        if session.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": session.system_prompt})
        return self.chat_prompt.ids(messages, add_generation_prompt=True)

    # ---- sessions ------------------------------------------------------------------------
    def create_session(self, session_id: str = "", system_prompt: Optional[str] = None,
                       keep_history: bool = True, owner_key: str = "", auto_created: bool = False) -> Session:
        """system_prompt None = the engine's shared prompt; "" = no system message. At
        max_sessions the cheapest idle session is evicted (session.eviction_victim)."""
        with self._lock:
            session_id = session_id or uuid.uuid4().hex[:12]
            if session_id in self.sessions:
                raise InvalidRequestError(f"session {session_id!r} already exists")
            if system_prompt is not None and len(system_prompt) > self.config.max_input_chars:
                raise InvalidRequestError(f"system prompt has {len(system_prompt)} characters, "
                                          f"limit max_input_chars={self.config.max_input_chars}")
            if len(owner_key) > MAX_OWNER_KEY_CHARS:
                raise InvalidRequestError(f"owner_key has {len(owner_key)} characters, at most {MAX_OWNER_KEY_CHARS}")
            if system_prompt is None:
                system_prompt = self.config.system_prompt or None
            elif system_prompt == "":
                system_prompt = None
            shared = system_prompt is not None and system_prompt == self.config.system_prompt
            prefix = self.prefix_ids if shared else (self.render_prefix(system_prompt) if system_prompt else [])
            if len(prefix) >= self.max_context:
                raise InvalidRequestError(f"system prompt is {len(prefix)} tokens, context limit {self.max_context}")
            if len(self.sessions) >= self.config.max_sessions:
                self._evict_for(session_id, bool(owner_key))
            session = Session(session_id, system_prompt, prefix, shared, keep_history, owner_key, auto_created)
            self.sessions[session_id] = session
            return session

    def _evict_for(self, session_id: str, owned: bool) -> None:
        victim = eviction_victim(self.sessions.values(), self._in_forward, for_owned=owned)
        if victim is None:
            which = "session is busy" if owned else "session without an owner_key is busy (owned ones are kept)"
            raise InvalidRequestError(f"max_sessions={self.config.max_sessions} reached and every {which}")
        freed = self.destroy_session(victim.session_id, victim.owner_key)
        self.sessions_evicted += 1
        log.info("session %r evicted for %r (max_sessions=%d reached; it was idle %.0f s, %s, %d blocks freed)",
                 victim.session_id, session_id, self.config.max_sessions, time.monotonic() - victim.last_used,
                 "owned" if victim.owner_key else ("auto-created" if victim.auto_created else "created"), freed)

    def _session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise UnknownSessionError(f"unknown session {session_id!r}")
        return session

    def _settled_session(self, session_id: str, owner_key: str) -> Session:
        """The session, once no forward pass is computing it; call with the lock held.

        Waiting releases the lock, so the session is looked up (and its owner checked) again
        after every wait: it may have been destroyed, or re-created under the same id, meanwhile."""
        while True:
            session = self._session(session_id)
            session.authorize(owner_key)
            if session_id not in self._in_forward:
                return session
            self._forward_done.wait()

    def destroy_session(self, session_id: str, owner_key: str = "") -> int:
        """Cancel its requests, return every block; -> blocks returned to the pool."""
        with self._lock:
            session = self._settled_session(session_id, owner_key)
            available = self.kv.pool.num_available
            self._cancel_all(session, "session destroyed")
            if session.has_kv:
                self.kv.free(session_id)
            del self.sessions[session_id]
            return self.kv.pool.num_available - available

    def reset_session(self, session_id: str, owner_key: str = "") -> int:
        """Forget the conversation, keep the system prompt; -> blocks returned to the pool."""
        with self._lock:
            session = self._settled_session(session_id, owner_key)
            available = self.kv.pool.num_available
            self._cancel_all(session, "session reset")
            session.messages.clear()
            if session.has_kv:
                self.kv.truncate(session_id, min(len(session.prefix_ids), self.kv.num_tokens(session_id)))
            session.touch()
            return self.kv.pool.num_available - available

    def cancel(self, session_id: str, owner_key: str = "") -> bool:
        """Cancel the session's running and queued requests; -> whether there was any."""
        with self._lock:
            session = self._settled_session(session_id, owner_key)
            return self._cancel_all(session, "cancelled by client") > 0

    def expire_idle_sessions(self, idle_timeout_s: float, auto_idle_timeout_s: float) -> list:
        """Destroy every session idle (nothing queued or running) for longer than its timeout
        (auto-created sessions: auto_idle_timeout_s; 0 = never); -> [(session_id, idle s, blocks
        freed)]. Checked and destroyed under one lock hold: a command arriving meanwhile is never
        cancelled by it."""
        now = time.monotonic()
        expired = []
        with self._lock:
            for session_id, session in list(self.sessions.items()):
                timeout = auto_idle_timeout_s if session.auto_created else idle_timeout_s
                idle = now - session.last_used
                if timeout > 0 and idle > timeout and not session.busy and session_id not in self._in_forward:
                    expired.append((session_id, idle, self.destroy_session(session_id, session.owner_key)))
        return expired

    def _cancel_all(self, session: Session, why: str) -> int:
        victims = list(session.queued) + ([session.active] if session.active else [])
        for request in victims:
            self.scheduler.finish(request, FinishReason.CANCELLED, why)
        return len(victims)

    # ---- requests ------------------------------------------------------------------------
    def submit(self, session_id: str, text: str, params: SamplingParams, raw: bool = False,
               on_event: Optional[Callable[[TokenEvent], None]] = None,
               create_if_missing: bool = False, owner_key: str = "") -> Request:
        """Queue a turn. Raises InvalidRequestError / UnknownSessionError before queueing.

        create_if_missing: an unknown session is created (with the shared prompt) in the same
        locked step, after the request has been validated, so a rejected first command leaves
        nothing behind and no other call can see the session without its request."""
        with self._lock:
            params = params.validate(self.config.max_new_tokens_limit)
            if not isinstance(text, str) or not text.strip():
                raise InvalidRequestError("empty prompt: text has no non-whitespace character")
            if len(text) > self.config.max_input_chars:
                raise InvalidRequestError(f"prompt has {len(text)} characters, limit max_input_chars={self.config.max_input_chars}")
            # a quarter of the queue is kept for owned sessions: a flood of anonymous commands
            # (new session ids, no key) cannot lock an operator out
            session = self.sessions.get(session_id)
            owned = bool(session.owner_key) if session is not None else bool(owner_key)
            limit = self.config.max_queued_requests if owned else max(1, self.config.max_queued_requests * 3 // 4)
            if len(self.queue) >= limit:
                held = "" if owned else " for sessions without an owner_key"
                raise InvalidRequestError(f"engine queue full{held} ({len(self.queue)} requests waiting, "
                                          f"max_queued_requests={self.config.max_queued_requests})")
            cost = held_bytes(text, params)
            held = sum(r.held_bytes for r in self.queue)
            if held + cost > self.config.max_queued_bytes:
                raise InvalidRequestError(f"queued requests hold {held} bytes and this one {cost}; limit "
                                          f"max_queued_bytes={self.config.max_queued_bytes}")
            session = self.sessions.get(session_id)
            if session is None and create_if_missing:
                session = self.create_session(session_id, owner_key=owner_key, auto_created=True)
            elif session is None:
                raise UnknownSessionError(f"unknown session {session_id!r}")
            session.authorize(owner_key)
            if len(session.queued) >= self.config.max_pending_per_session:
                raise InvalidRequestError(f"session {session_id!r} has {len(session.queued)} queued requests "
                                          f"(max_pending_per_session={self.config.max_pending_per_session})")
            request = Request(next(self._ids), session_id, text, params, raw, on_event,
                              Sampler(params), Utf8StreamDecoder(self.tokenizer), StopStringMatcher(params.stop),
                              held_bytes=cost)
            session.queued.append(request)
            self.queue.append(request)
            session.touch()
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

    def has_work(self) -> bool:
        with self._lock:
            return bool(self.queue or self.running)

    def step(self) -> bool:
        """One scheduling round; -> whether any work was done."""
        return self.scheduler.step()

    # ---- statistics ----------------------------------------------------------------------
    def stats(self) -> EngineStats:
        with self._lock:
            kv = self.kv.stats()
            sessions = []
            for s in self.sessions.values():
                state = s.active.state.value if s.active else ("queued" if s.queued else "idle")
                has = s.has_kv
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
                evictions=kv.evictions, preemptions=self.preemptions, queue_length=len(self.queue),
                running=len(self.running), weights_bytes=self.model.weights.num_bytes,
                arena_bytes=self.arena.num_bytes, locked_bytes=self.locked_bytes,
                sessions_evicted=self.sessions_evicted, sessions=sessions)
