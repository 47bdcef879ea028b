"""Peer process for test_interfaces.py: real rclpy traffic with every custom interface.

Run as `python interface_peer.py [max_seconds]` in its own process. It serves
CreateSession on `interface_test/create_session`; for every Command received on
`interface_test/command` it publishes, once its readers are matched, the Command back on
`interface_test/command_echo`, the chunks of make_chunks() on `interface_test/token_chunks`
and make_pool_status() on `interface_test/pool_status`. The test builds the same expected
messages with these functions and compares whole messages.
"""
import sys
import time

import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node

from builtin_interfaces.msg import Time
from edge_slm_node.msg import Command, PoolStatus, SessionStatus, TokenChunk
from edge_slm_node.srv import CreateSession

NAMESPACE = 'interface_test'
CHUNK_CHARS = 3
GENERATED_SESSION_ID = 'session-0001'
BLOCK_SIZE = 16


def make_create_session_response(request):
    """CreateSession.Response for a request; an empty session_id gets GENERATED_SESSION_ID."""
    prompt_bytes = len(request.system_prompt.encode('utf-8'))
    return CreateSession.Response(
        success=True,
        session_id=request.session_id or GENERATED_SESSION_ID,
        message=f'keep_history={request.keep_history} prompt={request.system_prompt}',
        prefix_tokens=prompt_bytes,
        shared_blocks=prompt_bytes // BLOCK_SIZE)


def make_chunks(command):
    """TokenChunks streaming command.text back, CHUNK_CHARS code points each, the last done."""
    pieces = [command.text[i:i + CHUNK_CHARS] for i in range(0, len(command.text), CHUNK_CHARS)]
    pieces = pieces or ['']
    chunks = []
    for seq, piece in enumerate(pieces):
        done = seq == len(pieces) - 1
        chunks.append(TokenChunk(
            session_id=command.session_id,
            request_id=command.request_id,
            seq=seq,
            text=piece,
            done=done,
            finish_reason='stop' if done else '',
            error='',
            prompt_tokens=4_000_000_000,           # near the uint32 limit
            cached_prompt_tokens=BLOCK_SIZE * 3,
            completion_tokens=seq + 1,
            ttft_ms=12.25 if done else 0.0,         # float32-exact values only
            decode_tokens_per_s=75.5 if done else 0.0))
    return chunks


def make_pool_status(session_ids):
    """A PoolStatus with one SessionStatus per session id, values near their type limits."""
    states = ['idle', 'queued', 'prefill', 'decode']
    sessions = [
        SessionStatus(session_id=sid, num_tokens=100 + i, num_blocks=7 + i,
                      shared_blocks=3, state=states[i % len(states)])
        for i, sid in enumerate(session_ids)]
    return PoolStatus(
        stamp=Time(sec=1_700_000_000, nanosec=123_456_789),
        block_size=BLOCK_SIZE,
        bytes_per_block=368_640,
        total_blocks=4096,
        free_blocks=4000,
        used_blocks=96,
        shared_blocks=3,
        cached_blocks=12,
        usage_ratio=0.0234375,
        kv_bytes_in_use=96 * 368_640,
        prefix_query_tokens=2**40 + 1,
        prefix_hit_tokens=2**40,
        preemptions=2**64 - 1,
        queue_length=2,
        sessions=sessions,
        rss_bytes=300 * 2**20,
        weights_bytes=98 * 2**20)


class InterfacePeer(Node):

    def __init__(self):
        super().__init__('interface_peer', namespace=NAMESPACE)
        self.session_ids = []
        self.pending = []   # Commands received and not yet answered
        self.chunk_pub = self.create_publisher(TokenChunk, 'token_chunks', 100)
        self.pool_pub = self.create_publisher(PoolStatus, 'pool_status', 10)
        self.echo_pub = self.create_publisher(Command, 'command_echo', 10)
        self.create_subscription(Command, 'command', self.on_command, 10)
        self.create_service(CreateSession, 'create_session', self.on_create_session)
        self.create_timer(0.02, self.flush)

    def on_create_session(self, request, response):
        answer = make_create_session_response(request)
        self.session_ids.append(answer.session_id)
        return answer

    def on_command(self, command):
        self.pending.append(command)

    def flush(self):
        publishers = (self.chunk_pub, self.pool_pub, self.echo_pub)
        if not self.pending or any(p.get_subscription_count() == 0 for p in publishers):
            return   # first messages are lost until the reader is discovered
        while self.pending:
            command = self.pending.pop(0)
            self.echo_pub.publish(command)
            for chunk in make_chunks(command):
                self.chunk_pub.publish(chunk)
            self.pool_pub.publish(make_pool_status(self.session_ids))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    max_seconds = float(argv[0]) if argv else 120.0
    rclpy.init()
    node = InterfacePeer()
    deadline = time.monotonic() + max_seconds   # never outlive a test that died
    try:
        while rclpy.ok() and time.monotonic() < deadline:
            rclpy.spin_once(node, timeout_sec=0.1)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == '__main__':
    main()
