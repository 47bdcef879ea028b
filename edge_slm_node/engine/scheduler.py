"""schedule() -> StepPlan: which requests are admitted, which decode, which prompt chunks run.

Admission is FIFO, except that requests still waiting for their first token go before
resumed ones: a request whose blocks do not fit waits (so a long request is never starved by
short ones) until blocks are freed or queue_timeout_s passes. While requests wait for a decode
slot, running requests yield theirs (their KV kept): to a request waiting for its first token
after one decode step of their own, to a resumed one after fair_share_steps. So a new
command's first token waits for prompt steps only, never for a round of long answers. A decoding sequence that needs a block when none is left preempts the most recently
started other request, whose KV is freed and recomputed later with the help of cached
prefix blocks. The scheduler owns the queue, the running list and every block-manager call
that claims or frees blocks; it never runs the model (KV copies go into the plan).
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable, Optional

from ..kv.block_manager import KVBlockManager
from ..kv.block_pool import NoFreeBlocksError
from .config import EngineConfig
from .plan import PromptChunk, Rejection, StepPlan
from .request import FinishReason, Request, RequestState
from .session import Session, common_prefix_length

PREFIX_SEQ_KEY = ("shared-prefix",)      # block-manager id of the pinned system-prompt sequence


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVBlockManager, sessions: dict, max_context: int,
                 build_prompt: Callable[[Request, Session, list], list], prefix_ids: list):
        """build_prompt(request, session, history ids) -> the turn's prompt ids (may raise
        ValueError: the turn is refused); prefix_ids: the pinned shared system prompt."""
        self.config = config
        self.kv = kv
        self.sessions = sessions
        self.max_context = max_context
        self.build_prompt = build_prompt
        self.prefix_ids = prefix_ids
        self.queue: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0

    # ---- what requests a session has -------------------------------------------------------
    def active(self, session_id: str) -> Optional[Request]:
        return next((r for r in self.running if r.session_id == session_id), None)

    def queued(self, session_id: str) -> list:
        return [r for r in self.queue if r.session_id == session_id]

    def busy(self, session_id: str) -> bool:
        return self.active(session_id) is not None or any(r.session_id == session_id for r in self.queue)

    def add(self, request: Request) -> None:
        self.queue.append(request)

    def remove(self, request: Request) -> bool:
        """Forget a finished request; -> whether its session's KV holds its turn (to settle)."""
        held = request in self.running or request.kv_kept
        if request in self.running:
            self.running.remove(request)
        if request in self.queue:
            self.queue.remove(request)
        return held

    # ---- the step's plan --------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        plan = StepPlan()
        self._share_decode_slots()
        self._admit(plan)
        self._expire_queue(plan)                 # only what could not be admitted times out
        for request in sorted([r for r in self.running if r.state is RequestState.DECODE], key=lambda r: r.started_at):
            if request.state is RequestState.DECODE and self._reserve_decode_slot(request, plan):
                plan.decode.append(request)      # (a later one may have preempted it meanwhile)
        plan.decode = [r for r in plan.decode if r.state is RequestState.DECODE]
        room = self.config.max_batch_tokens - len(plan.decode)
        for request in [r for r in self.running if r.state is RequestState.PREFILL]:
            if room <= 0:
                break
            count = min(room, len(request.prompt_ids) - request.prefill_done)
            plan.prompts.append(PromptChunk(request, request.prefill_done, count))
            room -= count
        return plan

    def _share_decode_slots(self) -> None:
        """Each waiting request takes the slot of a running one that has decoded at least one step
        since its admission (for a request without its first token) or fair_share_steps (for a
        resumed one); the one that decoded most yields first."""
        if len(self.running) < self.config.max_running:
            return
        waiting = self._admissible()
        fresh = sum(1 for r in waiting if r.first_token_at is None)
        decoding = sorted((r for r in self.running if r.state is RequestState.DECODE and r.turn_steps >= 1),
                          key=lambda r: -r.turn_steps)
        yielding = decoding[:fresh]
        due = [r for r in decoding[fresh:] if r.turn_steps >= self.config.fair_share_steps]
        for request in yielding + due[:len(waiting) - fresh]:
            self._suspend(request)

    def _suspend(self, request: Request) -> None:
        """Take a decoding request out of the batch, its KV kept, and queue it at the back; on
        readmission its sampled token is its one-token prompt, as it would have been decoded."""
        request.prompt_ids = self.kv.token_ids(request.session_id) + [request.next_token]
        self.running.remove(request)
        request.state = RequestState.QUEUED
        request.suspensions += 1
        request.kv_kept = True
        self.queue.append(request)

    def _admissible(self) -> list:
        """Queued requests that could start now (the first of their session, which runs nothing),
        those without a first token first, each kind in queue order."""
        busy = {r.session_id for r in self.running}
        heads = []
        for request in self.queue:
            if request.session_id not in busy:
                heads.append(request)
                busy.add(request.session_id)
        return sorted(heads, key=lambda r: r.first_token_at is not None)

    def _admit(self, plan: StepPlan) -> None:
        for request in self._admissible():
            if len(self.running) >= self.config.max_running:
                return
            session = self.sessions[request.session_id]
            while True:
                try:
                    admitted = self._start(request, session, plan)
                    break
                except NoFreeBlocksError:
                    if not self._release_idle_session_kv(keep=session):
                        return                  # FIFO: wait for blocks before admitting later ones
            self.queue.remove(request)
            if admitted:
                self.running.append(request)

    def _expire_queue(self, plan: StepPlan) -> None:
        now = time.monotonic()
        for request in [r for r in self.queue if r.started_at is None
                        and now - r.submitted_at > self.config.queue_timeout_s]:
            self.queue.remove(request)
            plan.rejected.append(Rejection(request, FinishReason.ERROR, (
                f"timed out after {self.config.queue_timeout_s:g} s in the queue (queue_timeout_s): "
                f"{len(self.running)} requests running, {self.kv.pool.num_available} KV blocks available")))

    def _release_idle_session_kv(self, keep: Session) -> bool:
        """Free the KV of the least recently used session that runs nothing (its history stays in
        messages and its blocks in the prefix cache until evicted); -> whether one was released."""
        running = {r.session_id for r in self.running}
        idle = [s for s in self.sessions.values() if self.kv.has_seq(s.session_id)
                and s.session_id not in running and s is not keep]
        if not idle:
            return False
        self.kv.free(min(idle, key=lambda s: s.last_used).session_id)
        return True

    # ---- starting a request -----------------------------------------------------------------
    def _start(self, request: Request, session: Session, plan: StepPlan) -> bool:
        """Prompt ids and blocks of a turn (or of a resumed request); False if it was rejected."""
        sid = request.session_id
        has_kv = self.kv.has_seq(sid)
        if not request.prompt_ids:                      # first admission (not a resume)
            try:
                request.prompt_ids = self.build_prompt(request, session, self.kv.token_ids(sid) if has_kv else [])
            except ValueError as error:                 # ChatTemplateError: the template refused the turn
                plan.rejected.append(Rejection(request, FinishReason.ERROR, f"cannot render the prompt: {error}"))
                return False
        prompt = request.prompt_ids
        if len(prompt) > self.max_context - 1:
            history = " with history" if session.messages else ""
            plan.rejected.append(Rejection(request, FinishReason.ERROR, (
                f"prompt is {len(prompt)} tokens{history}, context limit is {self.max_context} (max_context_tokens, "
                f"context_overflow={self.config.context_overflow}); "
                + ("reset the session or shorten the text" if history else "shorten the text"))))
            return False
        stats = self.kv.stats()
        needed = self.kv.prompt_blocks_needed(prompt) if not has_kv else 0
        if needed > stats.total_blocks - stats.pinned_blocks:
            plan.rejected.append(Rejection(request, FinishReason.ERROR, (
                f"prompt needs {needed} KV blocks, pool has {stats.total_blocks} ({stats.pinned_blocks} pinned); "
                f"raise kv_pool_mb")))
            return False
        fresh = not session.messages and request.preemptions == 0 and request.suspensions == 0
        if not has_kv and fresh and session.uses_shared_prefix and prompt[:len(self.prefix_ids)] == self.prefix_ids \
                and self.kv.has_seq(PREFIX_SEQ_KEY):
            self.kv.fork(PREFIX_SEQ_KEY, sid)           # the pinned prompt blocks, its last one copied on write
            session.calls.truncate(0)
            session.calls.record(0, len(self.prefix_ids))   # computed as one call at start (ModelRunner.prefill)
            has_kv = True
        if has_kv:
            done = min(common_prefix_length(self.kv.token_ids(sid), prompt), len(prompt) - 1)
            self.kv.truncate(sid, done)
            plan.copies += self.kv.reserve(sid, len(prompt) - done)
        else:                                           # history to rebuild: reuse what the prefix cache holds
            done = self.kv.allocate_prompt(sid, prompt)
        request.prefill_done = done
        request.state = RequestState.PREFILL
        request.turn_steps = 0
        request.kv_kept = False
        if request.started_at is None:                  # first admission: what the turn found cached
            request.cached_prompt_tokens = done
            request.started_at = time.monotonic()
            session.calls.truncate(done)                # its new tokens are one call; a resume keeps the shapes
            session.calls.record(done, len(prompt))
        return True

    # ---- decode slots -----------------------------------------------------------------------
    def _reserve_decode_slot(self, request: Request, plan: StepPlan) -> bool:
        while True:
            try:
                plan.copies += self.kv.reserve(request.session_id, 1)
                return True
            except NoFreeBlocksError:
                if len(self.running) == 1:
                    self.running.remove(request)
                    plan.rejected.append(Rejection(request, FinishReason.POOL_EXHAUSTED, (
                        f"KV pool exhausted: sequence alone holds {self.kv.num_blocks(request.session_id)} of "
                        f"{self.kv.stats().total_blocks} blocks and needs one more")))
                    request.kv_kept = True              # its blocks hold the turn: settled when it finishes
                    return False
                newest = max(self.running, key=lambda r: r.started_at)
                self._preempt(newest)                   # the older request keeps its blocks
                if newest is request:
                    return False

    def _preempt(self, request: Request) -> None:
        """Free the request's KV and put it back at the head of the queue (recomputed later)."""
        kept = self.kv.token_ids(request.session_id)
        # resume from everything known so far: committed KV + rest of the prompt + sampled token
        request.prompt_ids = kept + request.prompt_ids[len(kept):] if request.state is RequestState.PREFILL \
            else kept + ([request.next_token] if request.next_token is not None else [])
        self.kv.free(request.session_id)
        self.running.remove(request)
        request.state = RequestState.QUEUED
        request.preemptions += 1
        self.preemptions += 1
        self.queue.appendleft(request)
