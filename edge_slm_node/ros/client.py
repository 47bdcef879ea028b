"""`edge_slm_client [--session ID] TEXT`: publish one command, print the answer as it streams."""
from __future__ import annotations

import argparse
import random
import sys
import time

import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.utilities import remove_ros_args

from edge_slm_node.msg import Command, TokenChunk


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="edge_slm_client", description=__doc__)
    parser.add_argument("--session", default="console", help="session id (created on first use)")
    parser.add_argument("--max-new-tokens", type=int, default=0, help="0 = node default")
    parser.add_argument("--temperature", type=float, default=-1.0, help="< 0 = node default, 0 = greedy")
    parser.add_argument("--seed", type=int, default=-1)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the whole answer")
    parser.add_argument("text")
    return parser.parse_args(argv)


def main(args=None) -> int:
    argv = remove_ros_args(sys.argv if args is None else args)[1:]
    options = parse_args(argv)
    rclpy.init(args=args)
    node = rclpy.create_node("edge_slm_client")
    # keep-all: a busy terminal that reads slowly must not lose pieces of its answer
    qos = QoSProfile(depth=100, history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE)
    request_id = random.getrandbits(63)
    finished = {}

    def on_chunk(chunk: TokenChunk):
        if chunk.request_id != request_id or chunk.session_id != options.session:
            return
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        if chunk.done:
            finished["chunk"] = chunk

    node.create_subscription(TokenChunk, "tokens", on_chunk, qos)
    publisher = node.create_publisher(Command, "command", qos)
    try:
        deadline = time.monotonic() + min(options.timeout, 30.0)
        while publisher.get_subscription_count() == 0 or node.count_publishers("tokens") == 0:
            if time.monotonic() > deadline:
                print("edge_slm_client: no edge_slm_node found on 'command'/'tokens'", file=sys.stderr)
                return 3
            rclpy.spin_once(node, timeout_sec=0.1)
        time.sleep(0.2)                          # let the reverse (tokens) match settle too
        publisher.publish(Command(session_id=options.session, request_id=request_id, text=options.text,
                                  max_new_tokens=options.max_new_tokens, temperature=options.temperature,
                                  seed=options.seed))
        deadline = time.monotonic() + options.timeout
        while "chunk" not in finished:
            if time.monotonic() > deadline:
                print(f"\nedge_slm_client: no final chunk within {options.timeout:g} s", file=sys.stderr)
                return 4
            rclpy.spin_once(node, timeout_sec=0.1)
        chunk = finished["chunk"]
        print()
        print(f"[{chunk.finish_reason}: prompt {chunk.prompt_tokens} tokens ({chunk.cached_prompt_tokens} cached), "
              f"{chunk.completion_tokens} generated, first token {chunk.ttft_ms:.0f} ms, "
              f"{chunk.decode_tokens_per_s:.1f} tok/s]" + (f" error: {chunk.error}" if chunk.error else ""),
              file=sys.stderr)
        return 0 if chunk.finish_reason != "error" else 1
    except (KeyboardInterrupt, ExternalShutdownException):
        return 130
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())
