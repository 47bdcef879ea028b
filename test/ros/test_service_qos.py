"""The session services' queues as the node configures them (ros/services.py session_service_qos and
config/fastdds_memory.xml), across processes: the profile parses, and requests are kept in full
while the service is busy (keep-all; a keep-last queue of 1000 would drop the excess silently).
The reply side (keep-last) is test_hostile_clients.py::test_hung_client_does_not_silence_the_services."""
import json
import subprocess
import sys
from pathlib import Path

PEER = Path(__file__).with_name("service_qos_peer.py")


def test_profile_parses_and_a_backlog_beyond_the_reply_depth_is_answered_in_full(ros_env):
    env = {k: v for k, v in ros_env.items() if k not in ("FASTDDS_DEFAULT_PROFILES_FILE",
                                                          "FASTRTPS_DEFAULT_PROFILES_FILE")}
    server = subprocess.Popen([sys.executable, str(PEER), "server", "8"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        started = json.loads(server.stdout.readline())
        assert any("fastdds_memory.xml" in item for item in started["applied"]), started
        client = subprocess.run([sys.executable, str(PEER), "client", "2500"], env=env, capture_output=True,
                                text=True, timeout=180)
        assert client.returncode == 0, client.stderr[-3000:]
        result = json.loads(client.stdout.strip().splitlines()[-1])
        assert result == {"calls": 2500, "answers": 2500}, result
    finally:
        server.kill()
        _, errors = server.communicate()
    assert "XMLPARSER" not in errors and "Error parsing" not in errors, errors[-3000:]
