"""The session services: create, destroy, reset, cancel. Each answers at once; only a call on a
session inside the running forward pass waits for it (one step)."""
from __future__ import annotations

from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from edge_slm_node.srv import CancelGeneration, CreateSession, DestroySession, ResetSession

from ..engine.engine import UnknownSessionError
from ..engine.sampling import InvalidRequestError
from . import convert
from .guard import RateLimiter, guarded_service, rate_limited

SERVICE_TYPES = {"create_session": CreateSession, "destroy_session": DestroySession,
                 "reset_session": ResetSession, "cancel_generation": CancelGeneration}


def create_session_services(node, gate, callback_group, queue_depth: int, rate_limit_hz: float) -> RateLimiter:
    """The four services, guarded and rate limited together; -> their limiter (its rate can change).

    Each answers every request it takes, an error when over the rate limit. Their queues are
    keep-last queue_depth: rclpy gives a service one QoS for its request reader and its response
    writer, and Fast DDS sends a service's responses to every client of it, so with keep-all one
    client that stops reading (a hung process with thousands of calls in flight) fills the
    writer's history and every later answer, to every client, fails to send (measured:
    test_hung_client_does_not_silence_the_services). Keep-last never blocks on a reader; a client
    that fires more than queue_depth calls faster than the node takes them loses the excess."""
    qos = QoSProfile(depth=queue_depth, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE)
    limiter = RateLimiter(rate_limit_hz)
    log = node.get_logger()
    for name, handler in SessionServices(node, gate).handlers().items():
        node.create_service(SERVICE_TYPES[name], name, guarded_service(log, name, rate_limited(limiter, name, handler)),
                            qos_profile=qos, callback_group=callback_group)
    return limiter


class SessionServices:
    def __init__(self, node, gate):
        self.node = node
        self.gate = gate
        self.logger = node.get_logger()

    def handlers(self) -> dict:
        return {"create_session": self.on_create_session, "destroy_session": self.on_destroy_session,
                "reset_session": self.on_reset_session, "cancel_generation": self.on_cancel_generation}

    @staticmethod
    def _refuse(response, refusal: str):
        response.success, response.message = False, refusal
        return response

    def on_create_session(self, request, response):
        with self.gate.enter() as (engine, refusal):
            if engine is None:
                return self._refuse(response, refusal)
            try:
                if request.session_id:
                    convert.check_session_id(request.session_id)
                session = engine.create_session(request.session_id, request.system_prompt or None,
                                                request.keep_history, owner_key=request.owner_key)
            except InvalidRequestError as error:
                self.logger.warning(f"create_session refused: {error}")
                return self._refuse(response, str(error))
            response.success, response.session_id = True, session.session_id
            response.prefix_tokens = len(session.prefix_ids)
            response.shared_blocks = len(session.prefix_ids) // engine.config.block_size \
                if session.uses_shared_prefix else 0
        response.message = f"session {session.session_id!r} created"
        self.node.status_changed()
        return response

    def _session_call(self, response, call, verb: str):
        with self.gate.enter() as (engine, refusal):
            if engine is None:
                return self._refuse(response, refusal)
            try:
                result = call(engine)
            except (UnknownSessionError, InvalidRequestError) as error:
                self.logger.warning(f"{verb} refused: {error}")
                return self._refuse(response, str(error))
        response.success = True
        if hasattr(response, "freed_blocks"):
            response.freed_blocks = result
            response.message = f"{verb}: {result} blocks freed"
        else:
            response.message = f"{verb}: {'cancelled' if result else 'nothing was running'}"
        self.node.status_changed()
        return response

    def on_destroy_session(self, request, response):
        return self._session_call(response, lambda e: e.destroy_session(request.session_id, request.owner_key),
                                  "destroyed")

    def on_reset_session(self, request, response):
        return self._session_call(response, lambda e: e.reset_session(request.session_id, request.owner_key),
                                  "reset")

    def on_cancel_generation(self, request, response):
        return self._session_call(response, lambda e: e.cancel(request.session_id, request.owner_key), "cancel")
