"""rclpy nodes created in the test process itself, their participant on UDPv4 only.

Fast DDS's shared-memory listener can regenerate its port on the listener's own thread while the
participant closes it (SharedMemManager::Listener::regenerate_port against Listener::close, with
no lock between them, in 3.2 and upstream today). The test process died in destroy_node with
that stack about one run in five: SIGSEGV in interprocess_mutex::lock under
SharedMemChannelResource::release (clean-clone CI run of 4af4a97, gdb backtrace, 2026-12-04).
So the participants of this process do not use shared memory; node processes and every other
child keep Fast DDS's default transports (shared memory and UDP), and talk to these over UDP.
"""
from __future__ import annotations

import os

TRANSPORTS_VARIABLE = "FASTDDS_BUILTIN_TRANSPORTS"     # read as each participant is created


def create_udp_node(name: str, context, namespace: str | None = None):
    """rclpy.create_node in `context`, whose participant (made with its first node) is UDPv4 only."""
    import rclpy
    previous = os.environ.get(TRANSPORTS_VARIABLE)
    os.environ[TRANSPORTS_VARIABLE] = "UDPv4"
    try:
        return rclpy.create_node(name, namespace=namespace, context=context)
    finally:
        if previous is None:
            del os.environ[TRANSPORTS_VARIABLE]
        else:
            os.environ[TRANSPORTS_VARIABLE] = previous
