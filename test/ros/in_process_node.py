"""rclpy contexts and nodes created in the test process itself, their participant on UDPv4 only.

The test process died in destroy_node about one clean-clone run in five. The one native
backtrace (CI run of 4af4a97, 2026-12-04) is a SIGSEGV in interprocess_mutex::lock under
SharedMemChannelResource::release: Fast DDS closing its shared-memory listener. A race in its
code would explain it: a listener regenerates its port on its own thread, replacing the port
that Listener::close uses on the destroying thread, with no lock between them (3.2, and
upstream today). So the participants of this process do not use shared memory; node processes
and every other child keep their default transports and talk to these over UDP.

Two variables do it, each read at its own moment. rmw_fastrtps gives a participant of the
LOCALHOST discovery range (conftest.py) a shared-memory transport of its own, whatever
FASTDDS_BUILTIN_TRANSPORTS says, and rclpy.init fixes the range for its context; so the context
is made with the range left to Fast DDS, and its participant (made with its first node) with
UDPv4 as the only built-in transport. Its peers still find it: they announce themselves to
127.0.0.1, where it listens (test_interfaces.py checks both: the round trip, then /proc/self/maps).
"""
from __future__ import annotations

import contextlib
import os

UDP_ONLY = {
    "ROS_AUTOMATIC_DISCOVERY_RANGE": "SYSTEM_DEFAULT",   # read by rclpy.init
    "FASTDDS_BUILTIN_TRANSPORTS": "UDPv4",               # read as each participant is created
}


@contextlib.contextmanager
def udp_only_environment():
    """os.environ with UDP_ONLY set inside the block, as it was after it."""
    previous = {name: os.environ.get(name) for name in UDP_ONLY}
    os.environ.update(UDP_ONLY)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def create_udp_client(name: str, domain_id: int | None = None, namespace: str | None = None):
    """(context, node): a fresh rclpy context in `domain_id` (ROS_DOMAIN_ID when None) and its
    first node, whose participant uses no shared memory."""
    import rclpy
    context = rclpy.Context()
    with udp_only_environment():
        rclpy.init(context=context, domain_id=domain_id)
        node = rclpy.create_node(name, namespace=namespace, context=context)
    return context, node


def fastdds_shared_memory_mappings() -> list[str]:
    """Fast DDS shared-memory files this process maps (/proc/self/maps)."""
    with open("/proc/self/maps") as maps:
        fields = [line.split() for line in maps]
    return sorted({line[5] for line in fields if len(line) >= 6 and line[5].startswith("/dev/shm/fastdds_")})
