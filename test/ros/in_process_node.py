"""rclpy nodes created in the test process itself, their participant on UDPv4 only.

The test process died in destroy_node about one clean-clone run in five. The one native
backtrace (CI run of 4af4a97, 2026-12-04) is a SIGSEGV in interprocess_mutex::lock under
SharedMemChannelResource::release: Fast DDS closing its shared-memory listener. A race in its
code would explain it: a listener regenerates its port on its own thread, replacing the port
that Listener::close uses on the destroying thread, with no lock between them (3.2, and
upstream today). So the participants of this process do not use shared memory; node processes
and every other child keep Fast DDS's default transports (shared memory and UDP) and talk to
these over UDP. Known not to work as the tests run: under ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
(conftest.py) the participant still maps Fast DDS's shared-memory port segments (README, Tests).
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
