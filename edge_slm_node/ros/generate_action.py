"""The `generate` action: a Command as a goal, its text as feedback, its final chunk as result.

Each executing goal waits for its request's events on its own executor thread (rclpy's
coroutine path would re-run a waiting goal on every spin), so at most `max_goals` execute at
once and more are rejected. Cancelling a goal cancels its session's generation, like the
`cancel_generation` service: the request's blocks are freed at once.
"""
from __future__ import annotations

import queue
import threading

from rclpy.action import ActionServer, CancelResponse, GoalResponse

from edge_slm_node.action import Generate

from ..engine.engine import UnknownSessionError
from ..engine.sampling import InvalidRequestError
from .guard import guarded_call

SUCCEEDED_REASONS = ("stop", "length", "context_full", "tool_calls")
EVENT_POLL_S = 1.0


def request_id_of(goal_handle) -> int:
    return int.from_bytes(bytes(goal_handle.goal_id.uuid[:8]), "big")


class GenerateServer:
    def __init__(self, node, gate, commands, callback_group, max_goals: int):
        self.node = node
        self.gate = gate
        self.commands = commands
        self.logger = node.get_logger()
        self.max_goals = max_goals
        self._executing = 0
        self._lock = threading.Lock()
        log = self.logger
        self.server = ActionServer(
            node, Generate, "generate",
            execute_callback=guarded_call(log, "generate execute", self.execute, self._execute_failed),
            goal_callback=guarded_call(log, "generate goal", self.on_goal, lambda *_: GoalResponse.REJECT),
            cancel_callback=guarded_call(log, "generate cancel", self.on_cancel, lambda *_: CancelResponse.REJECT),
            callback_group=callback_group)

    def destroy(self) -> None:
        self.server.destroy()

    def on_goal(self, goal) -> GoalResponse:
        with self._lock:
            if self._executing >= self.max_goals:
                self.logger.warning(f"generate goal for session {goal.session_id[:64]!r} rejected: "
                                    f"{self._executing} goals executing (max_goals={self.max_goals})")
                return GoalResponse.REJECT
            self._executing += 1
        return GoalResponse.ACCEPT

    def on_cancel(self, goal_handle) -> CancelResponse:
        goal = goal_handle.request
        with self.gate.enter() as (engine, _):
            if engine is not None:          # closed: the transition has cancelled everything already
                try:
                    engine.cancel(goal.session_id, goal.owner_key)
                except (UnknownSessionError, InvalidRequestError) as error:
                    self.logger.warning(f"generate cancel for session {goal.session_id[:64]!r}: {error}")
                    return CancelResponse.REJECT
        self.node.wake_engine()
        return CancelResponse.ACCEPT

    def execute(self, goal_handle):
        try:
            return self._execute(goal_handle)
        finally:
            with self._lock:
                self._executing -= 1

    def _execute(self, goal_handle):
        goal = goal_handle.request
        result = Generate.Result(session_id=goal.session_id, request_id=request_id_of(goal_handle))
        events: queue.SimpleQueue = queue.SimpleQueue()
        with self.gate.enter() as (engine, refusal):
            if engine is None:
                return self._finish(goal_handle, result, "error", refusal)
            try:
                # the final error is read when the event happens: a transition's reason is set only meanwhile
                created = self.commands.submit(engine, goal, result.request_id, lambda event, key: events.put(
                    (event, key, self.commands.final_error(event))))
            except (InvalidRequestError, UnknownSessionError) as error:
                return self._finish(goal_handle, result, "error", str(error))
        if created:
            self.node.status_changed()
        pieces = []
        while True:
            try:
                event, key, final_error = events.get(timeout=EVENT_POLL_S)
            except queue.Empty:
                if self.node.host.engine is not engine:      # released under it: no final event will come
                    return self._finish(goal_handle, result, "error", "engine released", "".join(pieces))
                continue
            seq = self.commands.next_seq(event, key)
            if event.text:
                pieces.append(event.text)
            if event.text or event.finish_reason is None:
                try:
                    goal_handle.publish_feedback(Generate.Feedback(seq=seq, text=event.text))
                except Exception as error:                   # the goal is no longer active
                    self.logger.warning(f"generate feedback {seq} not published: {error}")
            if event.finish_reason is not None:
                request = event.request
                self.commands.publish_tool_calls(event, result.request_id)
                result.prompt_tokens = len(request.prompt_ids)
                result.cached_prompt_tokens = request.cached_prompt_tokens
                result.completion_tokens = len(request.generated_ids)
                result.ttft_ms = float(request.ttft_ms)
                result.decode_tokens_per_s = float(request.decode_tokens_per_s)
                self.node.status_changed()
                return self._finish(goal_handle, result, event.finish_reason.value, final_error, "".join(pieces))

    def _finish(self, goal_handle, result, finish_reason: str, error: str, text: str = ""):
        result.finish_reason, result.error, result.text = finish_reason, error, text
        if finish_reason == "cancelled" and goal_handle.is_cancel_requested:
            goal_handle.canceled()
        elif finish_reason in SUCCEEDED_REASONS:
            goal_handle.succeed()
        else:
            if error:
                self.logger.warning(f"generate goal {result.request_id} for session {result.session_id[:64]!r} "
                                    f"ended {finish_reason}: {error}")
            goal_handle.abort()
        return result

    def _execute_failed(self, goal_handle, error_text: str):
        result = Generate.Result(session_id=goal_handle.request.session_id, request_id=request_id_of(goal_handle),
                                 finish_reason="error", error=error_text)
        try:
            if goal_handle.is_active:
                goal_handle.abort()
        except Exception:                       # already terminal: the result still goes out
            pass
        return result
