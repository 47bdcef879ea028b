"""After the forward pass: commit KV, sample, stream text, stop, finish requests and settle KV."""
from __future__ import annotations

import logging
import time

from ..kv.block_manager import KVBlockManager
from ..model.tokenizer import Tokenizer
from .plan import StepPlan
from .request import FinishReason, Request, RequestState, TokenEvent
from .scheduler import Scheduler
from .tools import ToolCatalog

log = logging.getLogger(__name__)


class Postprocessor:
    def __init__(self, kv: KVBlockManager, tokenizer: Tokenizer, sessions: dict, scheduler: Scheduler,
                 max_context: int):
        self.kv = kv
        self.tokenizer = tokenizer
        self.sessions = sessions
        self.scheduler = scheduler
        self.max_context = max_context

    def apply(self, plan: StepPlan, logits, elapsed: float) -> None:
        """logits: one row per decode request, then one per prompt's last chunk, in plan order."""
        row = 0
        for request in plan.decode:
            request.decode_seconds += elapsed
            request.decode_steps += 1
            request.turn_steps += 1
            self.kv.commit(request.session_id, [request.next_token])
            self.accept_token(request, logits[row])
            row += 1
        for chunk in plan.prompts:
            request = chunk.request
            self.kv.commit(request.session_id, chunk.token_ids)
            request.prefill_done += chunk.count
            request.prefill_seconds += elapsed
            if chunk.last:
                request.state = RequestState.DECODE
                self.accept_token(request, logits[row])
                row += 1

    def accept_token(self, request: Request, logits) -> None:
        constraint = request.constraint
        if constraint is not None and not constraint.mask_logits(logits):
            self.finish(request, FinishReason.ERROR, f"{constraint.kind} constraint failed: {constraint.error}")
            return
        token = request.sampler.sample(logits, request.generated_ids)
        if request.first_token_at is None:
            request.first_token_at = time.monotonic()
        params = request.params
        if not params.ignore_eos and self.tokenizer.is_eog(token):
            self.finish(request, FinishReason.STOP)
            return
        if constraint is not None and not constraint.advance(token):
            self.finish(request, FinishReason.ERROR, f"{constraint.kind} constraint refused token {token}: "
                                                     f"{constraint.error}")
            return
        request.generated_ids.append(token)
        request.next_token = token
        text, stopped = request.stop_matcher.feed(request.decoder.feed(token))
        if text:
            request.text_out += text
            self._emit(request, text)
        if constraint is not None and constraint.complete and constraint.kind == "tools":
            self._finish_with_tool_call(request)
        elif stopped or (constraint is not None and constraint.complete):
            self.finish(request, FinishReason.STOP)
        elif len(request.generated_ids) >= params.max_new_tokens:
            self.finish(request, FinishReason.LENGTH)
        elif self.kv.num_tokens(request.session_id) + 1 >= self.max_context:
            self.finish(request, FinishReason.CONTEXT_FULL)

    def _finish_with_tool_call(self, request: Request) -> None:
        """The tools grammar completed a call: it ends the answer, and the session waits for its result."""
        call = ToolCatalog.parse_call(request.text_out, f"call-{request.serial}")
        if call is None:                    # the grammar guarantees a call; this would be a bug
            self.finish(request, FinishReason.ERROR, "tool call grammar completed without a call")
            return
        request.tool_calls.append(call)
        session = self.sessions.get(request.session_id)
        if session is not None:
            session.pending_tool_calls[call.call_id] = call.name
        self.finish(request, FinishReason.TOOL_CALLS)

    def finish(self, request: Request, reason: FinishReason, error: str = "") -> None:
        """End a request in any state: flush text, settle its session's KV, emit the final event."""
        if request.state is RequestState.FINISHED:
            return
        holds_turn = self.scheduler.remove(request)
        tail = ""
        if reason is not FinishReason.ERROR:
            tail, _ = request.stop_matcher.feed(request.decoder.flush())
            if reason is not FinishReason.STOP or not request.params.stop:
                tail += request.stop_matcher.flush()
        request.state = RequestState.FINISHED
        request.finish_reason = reason
        request.error = error
        request.finished_at = time.monotonic()
        request.text_out += tail
        request.kv_kept = False
        session = self.sessions.get(request.session_id)
        if session is not None:
            if holds_turn:
                self._settle_session_kv(session, request)
            session.touch()
        self._emit(request, tail, reason, error)

    def _settle_session_kv(self, session, request: Request) -> None:
        """After a turn: record it in history, drop uncommitted reservations, or roll back."""
        sid = session.session_id
        completed = request.finish_reason in (FinishReason.STOP, FinishReason.LENGTH, FinishReason.CONTEXT_FULL,
                                              FinishReason.TOOL_CALLS)
        if completed and not request.raw and session.keep_history:
            session.messages.append({"role": request.role, "content": request.text})
            session.messages.append({"role": "assistant", "content": request.text_out})
        if not self.kv.has_seq(sid):
            return
        committed = self.kv.num_tokens(sid)
        if not session.keep_history:
            keep = len(session.prefix_ids)
        elif completed:
            keep = committed
        else:                               # cancelled / failed turn: free its blocks now
            keep = request.cached_prompt_tokens
        self.kv.truncate(sid, min(committed, keep))
        session.calls.truncate(min(committed, keep))

    def _emit(self, request: Request, text: str, reason=None, error: str = "") -> None:
        """Hand one event to the request's subscriber (or keep it for synchronous callers)."""
        event = TokenEvent(request, text, reason, error)
        if request.on_event is None:
            request.events.append(event)
            return
        try:
            request.on_event(event)
        except Exception as failure:        # a broken subscriber must not stop the engine
            log.error("request %d of %r: its event subscriber failed: %s: %s", request.serial,
                      request.session_id, type(failure).__name__, failure)
