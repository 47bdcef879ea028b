"""Commands in, token chunks out: one engine request per command, exactly one final chunk each.

Used by the `command` topic and the `generate` action alike: `submit` validates a command-shaped
request and queues it, calling `on_event` on the engine thread for every piece of text.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Callable

from edge_slm_node.msg import Command, ToolCall

from ..engine.engine import UnknownSessionError
from ..engine.sampling import InvalidRequestError
from . import convert


class CommandStreams:
    def __init__(self, node, gate, token_publisher, max_early_commands: int, tool_call_publisher):
        self.node = node                       # runtime settings, status changes, logger
        self.gate = gate
        self.token_publisher = token_publisher
        self.tool_call_publisher = tool_call_publisher
        self.logger = node.get_logger()
        self._lock = threading.Lock()
        self._chunk_seq: dict = {}
        self._in_flight: set = set()           # (session_id, client request_id) not yet finished
        self._early: deque = deque(maxlen=max_early_commands)
        self.hold_early = False                # autostart under way: hold commands until active
        self.cancel_reason = ""                # set while a transition cancels everything

    # ---- the command topic -------------------------------------------------------------------
    def on_command(self, command: Command) -> None:
        with self.gate.enter() as (engine, refusal):
            if engine is None:
                self._refuse(command, refusal)
                return
            try:
                created = self.submit(engine, command, command.request_id,
                                      lambda event, key: self._publish_event(event, key))
            except (InvalidRequestError, UnknownSessionError) as error:
                self.publish_error(command, str(error))
                return
        if created:
            self.node.status_changed()

    def _refuse(self, command: Command, refusal: str) -> None:
        with self._lock:
            holding = self.hold_early
            if holding and len(self._early) < self._early.maxlen:
                self._early.append(command)
                return
        self.publish_error(command, f"{refusal}, and its start-up queue is full" if holding else refusal)

    def replay_early(self) -> None:
        """Once active: serve the commands held while autostart was under way."""
        with self._lock:
            self.hold_early = False
            held = list(self._early)
            self._early.clear()
        for command in held:
            self.node.command_callback(command)

    def refuse_early(self, why: str) -> None:
        with self._lock:
            self.hold_early = False
            held = list(self._early)
            self._early.clear()
        for command in held:
            self.publish_error(command, why)

    def submit(self, engine, command, request_id: int, on_event: Callable) -> bool:
        """Queue one turn (raises InvalidRequestError / UnknownSessionError); -> whether it
        created the session. on_event(event, key) runs on the engine thread."""
        runtime = self.node.runtime
        session_id = convert.check_session_id(command.session_id)
        params = convert.sampling_from_command(command, runtime.defaults)
        created = session_id not in engine.sessions
        if created and not runtime.auto_create_sessions:
            raise UnknownSessionError(f"unknown session {session_id!r} (auto_create_sessions is false)")
        self._queue(session_id, request_id, lambda listener: engine.submit(
            session_id, command.text, params, on_event=listener,
            create_if_missing=runtime.auto_create_sessions, owner_key=command.owner_key), on_event)
        return created

    def submit_tool_result(self, engine, request) -> None:
        """A SubmitToolResult request: the tool turn queued, its answer streamed on `tokens` under
        the request's request_id with the node's default sampling (raises as submit does)."""
        session_id = convert.check_session_id(request.session_id)
        self._queue(session_id, request.request_id, lambda listener: engine.submit_tool_result(
            session_id, request.call_id, request.content, self.node.runtime.defaults, on_event=listener,
            owner_key=request.owner_key), lambda event, key: self._publish_event(event, key))

    def _queue(self, session_id: str, request_id: int, submit: Callable, on_event: Callable) -> None:
        """submit(listener) with the (session, request_id) pair marked in flight until its final event."""
        key = (session_id, request_id)
        with self._lock:
            if key in self._in_flight:
                raise InvalidRequestError(f"request_id {request_id} is already pending on session "
                                          f"{session_id!r}; use a new request_id per command")
            self._in_flight.add(key)
        try:
            submit(lambda event, k=key: on_event(event, k))
        except BaseException:
            with self._lock:
                self._in_flight.discard(key)
            raise
        self.node.wake_engine()

    def next_seq(self, event, key) -> int:
        """The chunk number of this event; a final event retires the request."""
        request = event.request
        with self._lock:
            seq = self._chunk_seq.get(request.serial, 0)
            self._chunk_seq[request.serial] = seq + 1
            if event.finish_reason is not None:
                del self._chunk_seq[request.serial]
                self._in_flight.discard(key)
        return seq

    def final_error(self, event) -> str:
        if event.finish_reason is not None and event.finish_reason.value == "cancelled" and self.cancel_reason:
            return self.cancel_reason
        return event.error

    def _publish_event(self, event, key: tuple) -> None:
        """Runs on the engine thread: publish one chunk; a failure is logged, never raised."""
        if not self.node.context.ok():           # shutting down (Ctrl-C): nothing can be published now
            return
        request = event.request
        request_id = key[1]
        try:
            seq = self.next_seq(event, key)
            reason = event.finish_reason.value if event.finish_reason is not None else ""
            error = self.final_error(event)
            self.publish_tool_calls(event, request_id)
            self.token_publisher.publish(convert.token_chunk(request.session_id, request_id, seq, event.text,
                                                             request, finish_reason=reason, error=error))
            if event.finish_reason is not None and error:
                self.logger.warning(f"request {request_id} of {request.session_id!r} ended {reason}: {error}")
        except Exception as error:
            if not self.node.context.ok():       # shut down while publishing
                return
            self.logger.error(f"publishing a chunk of request {request_id} of {request.session_id!r} "
                              f"failed: {type(error).__name__}: {error}")
        if event.finish_reason is not None:
            self.node.status_changed()

    def publish_tool_calls(self, event, request_id: int) -> None:
        """A final event's tool calls on `tool_calls` (before its final chunk or action result)."""
        request = event.request
        for call in request.tool_calls if event.finish_reason is not None else ():
            self.tool_call_publisher.publish(ToolCall(session_id=request.session_id, request_id=request_id,
                                                      call_id=call.call_id, name=call.name,
                                                      arguments_json=call.arguments_json))
            readers = self.tool_call_publisher.get_subscription_count()
            log = self.logger.info if readers else self.logger.warning
            log(f"request {request_id} of {request.session_id!r} called {call.name} ({call.call_id}): "
                f"{call.arguments_json[:200]}; " + (f"{readers} tool_calls subscriber(s)" if readers else
                                                    "nobody subscribes to tool_calls, so no executor will run it"))

    def publish_error(self, command: Command, error: str) -> None:
        self.logger.warning(f"command {command.request_id} for session {command.session_id[:64]!r} "
                            f"rejected: {error}")
        self.token_publisher.publish(convert.token_chunk(command.session_id, command.request_id, 0, "",
                                                         finish_reason="error", error=error))


def cancel_everything(engine, logger) -> int:
    """Cancel every running and queued request (each ends with a final `cancelled` event); ->
    how many sessions had any. For lifecycle transitions: the engine has no such call, so every
    session is cancelled with its own owner key."""
    cancelled = 0
    for session_id, session in list(engine.sessions.items()):
        try:
            cancelled += bool(engine.cancel(session_id, session.owner_key))
        except (UnknownSessionError, InvalidRequestError):     # destroyed meanwhile
            pass
        except Exception as error:
            logger.error(f"cancelling session {session_id!r} failed: {type(error).__name__}: {error}")
    return cancelled
