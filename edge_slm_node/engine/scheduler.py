"""step(): admit queued requests -> one forward over prefill chunk + decode tokens -> sample.

Admission is FIFO: a request whose blocks do not fit waits (so a long request is never
starved by short ones) until blocks are freed or queue_timeout_s passes. A decoding
sequence that needs a block when none is left preempts the most recently started other
request, which is requeued and later recomputed with the help of cached prefix blocks.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..kv.block_pool import NoFreeBlocksError
from .batch import prompt_token_batched
from .request import FinishReason, Request, RequestState, TokenEvent
from .session import common_prefix_length
from .decode_policy import DecodePolicy, DecodeWay

PREFIX_SEQ_KEY = ("shared-prefix",)      # block-manager id of the pinned system-prompt sequence
WARM_UP_SEQ_KEY = ("warm-up",)           # a throwaway one-token sequence run at start-up

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .engine import Engine


class Scheduler:
    def __init__(self, engine: "Engine"):
        self.engine = engine
        self.split_steps = 0                # decode steps split over the side threads
        self.decode_policy = DecodePolicy()

    # ---- shared prefix ---------------------------------------------------------------------
    def prefill_shared_prefix(self, seq_id, token_ids: list) -> None:
        """Compute the system prompt's KV once and pin its full blocks for the engine's life."""
        e = self.engine
        e.kv.allocate_prompt(seq_id, token_ids)
        self._prefill_tokens(seq_id, token_ids, 0)
        e.kv.pin_sequence(seq_id)

    def _prefill_tokens(self, seq_id, token_ids: list, start: int):
        """Run tokens[start:] of an already reserved sequence in chunks; -> last logits row."""
        e = self.engine
        logits = None
        while start < len(token_ids):
            chunk = token_ids[start:start + e.config.max_batch_tokens]
            e.batch.clear()
            e.batch.add(e.kv, seq_id, chunk, start, want_logits=True,
                        batched=_prompt_order(start, len(chunk), 0, len(token_ids)))
            logits = e.transformer.forward(e.batch.build(), e.arena.data)
            e.kv.commit(seq_id, chunk)
            start += len(chunk)
        return logits

    def warm_up_decode(self) -> None:
        """Run one throwaway token each way a decode step can go (one thread, thread pool, every
        side thread), so kernels are loaded from numba's cache (~0.2 s for the layers kernel) at
        start-up, not in a user's first step; its KV block is freed again."""
        e = self.engine
        queries = e.kv.prefix_query_tokens
        e.kv.allocate_prompt(WARM_UP_SEQ_KEY, [0])
        e.kv.prefix_query_tokens = queries                  # not a prompt: keep the hit-rate figures clean
        try:
            for builder in [e.batch] + [side.batch for side in e.sides]:
                builder.clear()
                builder.add(e.kv, WARM_UP_SEQ_KEY, [0], 0, want_logits=True)
            e.transformer.forward(e.batch.build(), e.arena.data, parallel=False)
            e.transformer.forward(e.batch.build(), e.arena.data, parallel=True)
            for side in e.sides:
                side.run(side.batch.build(), e.arena.data)
            for side in e.sides:
                side.wait()
        finally:
            e.kv.free(WARM_UP_SEQ_KEY)

    # ---- step ------------------------------------------------------------------------------
    def step(self) -> bool:
        e = self.engine
        with e._lock:
            self._share_decode_slots()
            self._admit()
            self._expire_queue()                 # only what could not be admitted times out
            plan = self._plan_batch()
            if plan is None:
                return False
            prefills, decoders, way, parts = plan
            batch = e.batch.build()
            side_batches = [side.batch.build() for side in e.sides[:parts - 1]]
            e._in_forward.update(r.session_id for r in decoders + prefills)
        started = time.monotonic()
        error = None
        try:
            if side_batches:
                logits = self._split_forward(batch, side_batches)
            else:
                logits = e.transformer.forward(batch, e.arena.data, parallel=way is not DecodeWay.ONE_THREAD)
        except Exception as exc:          # a kernel failure must not take the node down
            error = f"{type(exc).__name__}: {exc}"
        elapsed = time.monotonic() - started
        if way is not None and error is None:
            self.decode_policy.record(len(decoders), way, elapsed)
        with e._lock:
            e._in_forward.clear()
            e._forward_done.notify_all()
            if error is not None:
                for request in decoders + prefills:
                    self.finish(request, FinishReason.ERROR, f"forward pass failed: {error}")
                return True
            row = 0
            for request in decoders:
                request.decode_seconds += elapsed
                request.decode_steps += 1
                request.turn_steps += 1
                e.kv.commit(request.session_id, [request.next_token])
                self._accept_token(request, logits[row])
                row += 1
            for r in prefills:
                chunk = r.prompt_ids[r.prefill_done:r.prefill_done + r.prefill_chunk]
                e.kv.commit(r.session_id, chunk)
                r.prefill_done += len(chunk)
                r.prefill_seconds += elapsed
                if r.prefill_done == len(r.prompt_ids):
                    r.state = RequestState.DECODE
                    self._accept_token(r, logits[row])
                    row += 1
        return True

    def _plan_batch(self):
        """Fill e.batch with one token per decoding request, then prompt chunks of prefilling
        requests (oldest first) while max_batch_tokens allows -> (prefill requests, decoders, way,
        parts); None if idle. A decode-only step runs the decode policy's way (None for steps with
        prompt chunks: those use the thread pool); split into `parts` runs of decoders, the later
        ones into the side threads' batches."""
        e = self.engine
        e.batch.clear()
        decoders = []
        for request in sorted([r for r in e.running if r.state is RequestState.DECODE], key=lambda r: r.started_at):
            if request.state is not RequestState.DECODE:        # preempted by an earlier one
                continue
            if not self._reserve_decode_slot(request):
                continue
            decoders.append(request)
        prefills = [r for r in e.running if r.state is RequestState.PREFILL]
        way, parts = None, 1
        if not prefills and decoders:
            way = self.decode_policy.choose(len(decoders), can_split=bool(e.sides), has_pool=e.pool_threads > 1)
            if way is DecodeWay.SPLIT:
                parts = min(len(e.sides) + 1, len(decoders))
        builders = [e.batch] + [side.batch for side in e.sides[:parts - 1]]
        for index, builder in enumerate(builders):     # near-equal runs of decoders, in order
            if index:
                builder.clear()
            for request in decoders[index * len(decoders) // parts:(index + 1) * len(decoders) // parts]:
                position = e.kv.num_tokens(request.session_id)
                builder.add(e.kv, request.session_id, [request.next_token], position, want_logits=True)
        chunked = []
        for r in prefills:
            room = e.config.max_batch_tokens - e.batch.num_tokens
            if room <= 0:
                break
            r.prefill_chunk = min(room, len(r.prompt_ids) - r.prefill_done)
            last = r.prefill_done + r.prefill_chunk == len(r.prompt_ids)
            e.batch.add(e.kv, r.session_id, r.prompt_ids[r.prefill_done:r.prefill_done + r.prefill_chunk],
                        r.prefill_done, want_logits=last,
                        batched=_prompt_order(r.prefill_done, r.prefill_chunk, r.cached_prompt_tokens,
                                              len(r.prompt_ids)))
            chunked.append(r)
        if not decoders and not chunked:
            return None
        return chunked, decoders, way, parts

    def _split_forward(self, batch, side_batches) -> list:
        """Split decode: each side batch's forward on its side thread while batch's runs here, all
        with single-threaded kernels; -> logits rows in decoder order. Results are the same as one
        batched forward (every kernel computes a sequence's rows independently of the others)."""
        e = self.engine
        self.split_steps += 1
        sides = e.sides[:len(side_batches)]
        for side, side_batch in zip(sides, side_batches):
            side.run(side_batch, e.arena.data)
        error, rows = None, []
        try:
            rows += [*e.transformer.forward(batch, e.arena.data, parallel=False)]
        except Exception as exc:
            error = exc
        for side in sides:                  # every side thread is idle again before the step ends
            try:
                rows += [*side.wait()]
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error
        return rows

    def _reserve_decode_slot(self, request: Request) -> bool:
        e = self.engine
        while True:
            try:
                e.arena.copy_blocks(e.kv.reserve(request.session_id, 1))
                return True
            except NoFreeBlocksError:
                if len(e.running) == 1:
                    self.finish(request, FinishReason.POOL_EXHAUSTED,
                                f"KV pool exhausted: sequence alone holds {e.kv.num_blocks(request.session_id)} "
                                f"of {e.kv.stats().total_blocks} blocks and needs one more")
                    return False
                newest = max(e.running, key=lambda r: r.started_at)
                self._preempt(newest)           # the older request keeps its blocks
                if newest is request:
                    return False

    def _preempt(self, request: Request) -> None:
        """Free the request's KV and put it back at the head of the queue (recomputed later)."""
        e = self.engine
        session = e.sessions[request.session_id]
        kept = e.kv.token_ids(request.session_id)
        # resume from everything known so far: committed KV + rest of the prompt + sampled token
        request.prompt_ids = kept + request.prompt_ids[len(kept):] if request.state is RequestState.PREFILL \
            else kept + ([request.next_token] if request.next_token is not None else [])
        e.kv.free(request.session_id)
        session.has_kv = False
        e.running.remove(request)
        request.state = RequestState.QUEUED
        request.preemptions += 1
        e.preemptions += 1
        session.queued.appendleft(request)
        session.active = None
        e.queue.appendleft(request)

    def _share_decode_slots(self) -> None:
        """Round-robin when requests wait for a decode slot: each waiting one takes the slot of a
        running request that has decoded fair_share_steps since its admission (most first)."""
        e = self.engine
        if len(e.running) < e.config.max_running:
            return
        waiting = sum(1 for r in e.queue if self._admissible(r))
        due = [r for r in e.running if r.state is RequestState.DECODE and r.turn_steps >= e.config.fair_share_steps]
        for request in sorted(due, key=lambda r: -r.turn_steps)[:waiting]:
            self._suspend(request)

    def _suspend(self, request: Request) -> None:
        """Take a decoding request out of the batch, its KV kept, and queue it at the back; on
        readmission its sampled token is its one-token prompt, as it would have been decoded."""
        e = self.engine
        session = e.sessions[request.session_id]
        request.prompt_ids = e.kv.token_ids(request.session_id) + [request.next_token]
        e.running.remove(request)
        request.state = RequestState.QUEUED
        request.suspensions += 1
        request.kv_kept = True
        session.queued.appendleft(request)
        session.active = None
        e.queue.append(request)

    # ---- admission -------------------------------------------------------------------------
    def _admissible(self, request: Request) -> bool:
        session = self.engine.sessions[request.session_id]
        return session.active is None and session.queued[0] is request

    def _expire_queue(self) -> None:
        e = self.engine
        now = time.monotonic()
        never_started = [r for r in e.queue if r.started_at is None]
        for request in [r for r in never_started if now - r.submitted_at > e.config.queue_timeout_s]:
            self.finish(request, FinishReason.ERROR,
                        f"timed out after {e.config.queue_timeout_s:g} s in the queue (queue_timeout_s): "
                        f"{len(e.running)} requests running, {e.kv.pool.num_available} KV blocks available")

    def _admit(self) -> None:
        e = self.engine
        for request in list(e.queue):
            if len(e.running) >= e.config.max_running:
                return
            session = e.sessions[request.session_id]
            if not self._admissible(request):
                continue
            while True:
                try:
                    admitted = self._start(request, session)
                    break
                except NoFreeBlocksError:
                    if not self._release_idle_session_kv(keep=session):
                        return                  # FIFO: wait for blocks before admitting later ones
            if admitted:
                e.queue.remove(request)
                session.queued.popleft()

    def _drop_oldest_turns(self, request: Request, session) -> None:
        """context_overflow=drop_oldest: forget the oldest (user, assistant) turns after the system
        prompt until the new turn fits with room for its answer; the KV after the system prompt
        is then recomputed (its blocks no longer match)."""
        e = self.engine
        room = min(request.params.max_new_tokens, e.max_context // 4)
        dropped = 0
        while len(request.prompt_ids) + room > e.max_context and len(session.messages) >= 2:
            del session.messages[:2]
            dropped += 1
            request.prompt_ids = e.render_turn(session, request.text)
        if dropped:
            log.info("session %r: dropped its %d oldest turn(s) to fit max_context_tokens=%d (context_overflow="
                     "drop_oldest); prompt now %d tokens", session.session_id, dropped, e.max_context,
                     len(request.prompt_ids))

    def _release_idle_session_kv(self, keep) -> bool:
        """Free the KV of the least recently used idle session (its history stays in messages and
        its blocks stay in the prefix cache until evicted); -> whether one was released."""
        e = self.engine
        idle = [s for s in e.sessions.values() if s.has_kv and s.active is None and s is not keep]
        if not idle:
            return False
        victim = min(idle, key=lambda s: s.last_used)
        e.kv.free(victim.session_id)
        victim.has_kv = False
        return True

    def _start(self, request: Request, session) -> bool:
        """Tokenize the turn and reserve its blocks; False if it finished with an error instead."""
        e = self.engine
        sid = request.session_id
        if not request.prompt_ids:                      # first admission (not a preempted resume)
            try:
                if request.raw:
                    history = e.kv.token_ids(sid) if session.has_kv else []
                    bos = [e.tokenizer.bos_id] if not history and e.tokenizer.add_bos_default else []
                    request.prompt_ids = history + bos + e.tokenizer.encode(request.text)
                else:
                    request.prompt_ids = e.render_turn(session, request.text)
                    if e.config.context_overflow == "drop_oldest":
                        self._drop_oldest_turns(request, session)
            except ValueError as error:                 # ChatTemplateError: the template refused the turn
                self.finish(request, FinishReason.ERROR, f"cannot render the prompt: {error}")
                return False
        prompt = request.prompt_ids
        limit = e.max_context - 1
        if len(prompt) > limit:
            history = " with history" if session.messages else ""
            self.finish(request, FinishReason.ERROR,
                        f"prompt is {len(prompt)} tokens{history}, context limit is {e.max_context} "
                        f"(max_context_tokens, context_overflow={e.config.context_overflow}); "
                        + ("reset the session or shorten the text" if history else "shorten the text"))
            return False
        needed = e.kv.prompt_blocks_needed(prompt) if not session.has_kv else 0
        if needed > e.kv.stats().total_blocks - e.kv.stats().pinned_blocks:
            self.finish(request, FinishReason.ERROR,
                        f"prompt needs {needed} KV blocks, pool has {e.kv.stats().total_blocks} "
                        f"({e.kv.stats().pinned_blocks} pinned); raise kv_pool_mb")
            return False
        fresh_session = not session.messages and request.preemptions == 0 and request.suspensions == 0
        if not session.has_kv and fresh_session and session.uses_shared_prefix \
                and prompt[:len(e.prefix_ids)] == e.prefix_ids and e.kv.has_seq(PREFIX_SEQ_KEY):
            # share the pinned prompt blocks, copy its partly filled last block on first write
            e.kv.fork(PREFIX_SEQ_KEY, sid)
            session.has_kv = True
        if session.has_kv:
            done = min(common_prefix_length(e.kv.token_ids(sid), prompt), len(prompt) - 1)
            e.kv.truncate(sid, done)
            e.arena.copy_blocks(e.kv.reserve(sid, len(prompt) - done))
        else:                                # history to rebuild: reuse whatever the prefix cache holds
            done = e.kv.allocate_prompt(sid, prompt)
            session.has_kv = True
        request.prefill_done = done
        request.state = RequestState.PREFILL
        request.turn_steps = 0
        request.kv_kept = False
        if request.started_at is None:           # first admission: what the turn found cached
            request.cached_prompt_tokens = done
            request.started_at = time.monotonic()
        session.active = request
        e.running.append(request)
        return True

    # ---- output ----------------------------------------------------------------------------
    def _accept_token(self, request: Request, logits) -> None:
        e = self.engine
        previous = request.generated_ids
        token = request.sampler.sample(logits, previous)
        now = time.monotonic()
        if request.first_token_at is None:
            request.first_token_at = now
        p = request.params
        if not p.ignore_eos and e.tokenizer.is_eog(token):
            self.finish(request, FinishReason.STOP)
            return
        request.generated_ids.append(token)
        request.next_token = token
        text, stopped = request.stop_matcher.feed(request.decoder.feed(token))
        if text:
            request.text_out += text
            self._emit(request, text)
        if stopped:
            self.finish(request, FinishReason.STOP)
        elif len(request.generated_ids) >= p.max_new_tokens:
            self.finish(request, FinishReason.LENGTH)
        elif e.kv.num_tokens(request.session_id) + 1 >= e.max_context:
            self.finish(request, FinishReason.CONTEXT_FULL)

    def _emit(self, request: Request, text: str, reason=None, error: str = "") -> None:
        """Hand one event to the request's subscriber (or keep it for synchronous callers)."""
        event = TokenEvent(request, text, reason, error)
        if request.on_event is None:
            request.events.append(event)
        else:
            try:
                request.on_event(event)
            except Exception:               # a broken subscriber must not stop the engine
                pass

    def finish(self, request: Request, reason: FinishReason, error: str = "") -> None:
        """End a request in any state: flush text, release or keep KV per session policy, emit final event."""
        e = self.engine
        if request.state is RequestState.FINISHED:
            return
        was_running = request in e.running
        if was_running:
            e.running.remove(request)
        if request in e.queue:
            e.queue.remove(request)
        session = e.sessions.get(request.session_id)
        tail = ""
        if reason not in (FinishReason.ERROR,):
            tail, _ = request.stop_matcher.feed(request.decoder.flush())
            if reason is not FinishReason.STOP or not request.params.stop:
                tail += request.stop_matcher.flush()
        request.state = RequestState.FINISHED
        request.finish_reason = reason
        request.error = error
        request.finished_at = time.monotonic()
        request.text_out += tail
        if session is not None:
            if request in session.queued:
                session.queued.remove(request)
            if session.active is request or request.kv_kept:
                session.active = None if session.active is request else session.active
                self._settle_session_kv(session, request)
            session.touch()
        self._emit(request, tail, reason, error)

    def _settle_session_kv(self, session, request: Request) -> None:
        """After a turn: record it in history, drop uncommitted reservations, or roll back."""
        e = self.engine
        sid = session.session_id
        completed = request.finish_reason in (FinishReason.STOP, FinishReason.LENGTH, FinishReason.CONTEXT_FULL)
        if completed and not request.raw and session.keep_history:
            session.messages.append({"role": "user", "content": request.text})
            session.messages.append({"role": "assistant", "content": request.text_out})
        if not session.has_kv:
            return
        committed = e.kv.num_tokens(sid)
        if not session.keep_history:
            keep = len(session.prefix_ids)
        elif completed:
            keep = committed
        else:                               # cancelled / failed turn: free its blocks now
            keep = request.cached_prompt_tokens
        e.kv.truncate(sid, min(committed, keep))



def _prompt_order(start: int, count: int, first_new: int, end: int) -> list:
    """Per-token llama.cpp summation order for prompt positions [start, start+count) of a prompt
    whose new (uncached) tokens are [first_new, end)."""
    return [prompt_token_batched(i - first_new, end - first_new) for i in range(start, start + count)]
