"""Reproduces the open service-loss finding (README, Soak): an honest client's create/destroy calls
in a loop while `slots` clients flood create_session and `--generating` sessions decode; prints
each call that got no answer within --reply-timeout-s and a JSON summary.

    . scripts/env.sh && .venv/bin/python test/soak/flood_neighbour.py [--bursts 4] [--generating 4]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "ros"))

from node_harness import NodeProcess, RosClient, write_params   # noqa: E402

HOSTILE = HERE.parent / "ros" / "hostile_client.py"


class Generators:
    """Sessions that always have a command running, so the engine is busy as in the soak."""

    def __init__(self, client: RosClient, count: int):
        self.client, self.pending, self.next_id = client, {}, 1
        self.sessions = [f"gen-{k}" for k in range(count)]
        for session in self.sessions:
            client.call("create_session", session_id=session, owner_key="gen")

    def tend(self) -> None:
        for session in self.sessions:
            request_id = self.pending.get(session)
            if request_id is None or any(ch.done for ch in self.client.chunks_of(request_id)):
                self.next_id += 1
                self.pending[session] = self.next_id
                self.client.send(session, "Why is spindle 2 alarming?", self.next_id, max_new_tokens=24,
                                 owner_key="gen")


def burst(env: dict, index: int, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HOSTILE), "slots", "--seconds", str(seconds),
                             "--first-id", str(10_000_000 * (index + 1)), "--seed", str(index)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bursts", type=int, default=4)
    parser.add_argument("--burst-s", type=float, default=15.0)
    parser.add_argument("--generating", type=int, default=4)
    parser.add_argument("--reply-timeout-s", type=float, default=60.0)
    args = parser.parse_args()
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as directory:
        params = write_params(Path(directory), kv_pool_mb=24.0, max_context_tokens=640, max_sessions=12,
                              max_new_tokens=24, status_rate_hz=2.0, service_rate_limit_hz=500.0, qos_depth=1000)
        node = NodeProcess(params, env)
        client = RosClient(node)
        calls, lost = 0, []
        try:
            client.wait_ready()
            generators = Generators(client, args.generating)
            for index in range(args.bursts):
                flood = burst(env, index, args.burst_s)
                i = 0
                while flood.poll() is None:
                    name = "create_session" if i % 2 == 0 else "destroy_session"
                    session = f"honest-{index}-{i // 2}"
                    future = client.services[name].call_async(client.types[name].Request(session_id=session,
                                                                                         owner_key="honest"))
                    calls += 1
                    asked = time.monotonic()
                    while not future.done() and time.monotonic() - asked < args.reply_timeout_s:
                        client.executor.spin_once(timeout_sec=0.02)
                        generators.tend()
                    if not future.done():
                        lost.append({"burst": index, "call": name, "session": session})
                        print(f"no answer: {name} {session} (burst {index})", flush=True)
                    i += 1
                flood.communicate()
        finally:
            client.close()
            node.stop()
    print(json.dumps({"honest_calls": calls, "lost": lost}))
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
