"""The session services: create, destroy, reset, cancel, submit_tool_result. Each answers at once;
only a call on a session inside the running forward pass waits for it (one step)."""
from __future__ import annotations

from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from edge_slm_node.srv import CancelGeneration, CreateSession, DestroySession, ResetSession, SubmitToolResult

from ..engine.engine import UnknownSessionError
from ..engine.sampling import InvalidRequestError
from . import convert
from .guard import RateLimiter, guarded_service, rate_limited
from .process_memory import own_profile_loaded

SERVICE_TYPES = {"create_session": CreateSession, "destroy_session": DestroySession,
                 "reset_session": ResetSession, "cancel_generation": CancelGeneration,
                 "submit_tool_result": SubmitToolResult}


def create_session_services(node, gate, callback_group, queue_depth: int, rate_limit_hz: float) -> RateLimiter:
    """The session services, guarded and rate limited together; -> their limiter (its rate can change).
    Each answers every request it takes, an error when over the rate limit."""
    qos = session_service_qos(queue_depth, node.get_logger())
    limiter = RateLimiter(rate_limit_hz)
    log = node.get_logger()
    for name, handler in SessionServices(node, gate).handlers().items():
        node.create_service(SERVICE_TYPES[name], name, guarded_service(log, name, rate_limited(limiter, name, handler)),
                            qos_profile=qos, callback_group=callback_group)
    return limiter


def session_service_qos(queue_depth: int, logger) -> QoSProfile:
    """Requests keep-all, replies keep-last queue_depth.

    Fast DDS sends a service's replies to every client of it, so a keep-all reply writer blocks
    on the slowest reader: one hung client with thousands of replies unread made every later
    answer, to every client, fail to send (test_hung_client_does_not_silence_the_services).
    Requests stay keep-all so that a flood gets back-pressure instead of pushing other clients'
    calls out. rclpy gives both one QoS, so their kinds come from the node's Fast DDS profile
    (config/fastdds_memory.xml, "service"); under a profile of the user's both are keep-all and
    the hang protection is lost (logged)."""
    if own_profile_loaded():
        history = HistoryPolicy.SYSTEM_DEFAULT          # the kinds from the profile; depth: the replies kept
    else:
        history = HistoryPolicy.KEEP_ALL
        logger.warning("a Fast DDS profile of your own is loaded: the session services keep all replies, so "
                       "one client that stops reading them can block their answers; give requests keep-all "
                       "and replies keep-last (see config/fastdds_memory.xml)")
    return QoSProfile(depth=queue_depth, history=history, reliability=ReliabilityPolicy.RELIABLE)


class SessionServices:
    def __init__(self, node, gate):
        self.node = node
        self.gate = gate
        self.logger = node.get_logger()

    def handlers(self) -> dict:
        return {"create_session": self.on_create_session, "destroy_session": self.on_destroy_session,
                "reset_session": self.on_reset_session, "cancel_generation": self.on_cancel_generation,
                "submit_tool_result": self.on_submit_tool_result}

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

    def on_submit_tool_result(self, request, response):
        """Queues the tool turn and answers at once; the continued answer streams on `tokens`."""
        with self.gate.enter() as (engine, refusal):
            if engine is None:
                return self._refuse(response, refusal)
            try:
                self.node.commands.submit_tool_result(engine, request)
            except (UnknownSessionError, InvalidRequestError) as error:
                self.logger.warning(f"submit_tool_result refused: {error}")
                return self._refuse(response, str(error))
        response.success = True
        response.message = (f"result of {request.call_id!r} queued; the answer streams on tokens as request_id "
                            f"{request.request_id}")
        self.logger.info(f"session {request.session_id!r}: {response.message}")
        self.node.status_changed()
        return response
