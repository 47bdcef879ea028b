"""Reproduces the open service-loss finding (README, Hostile clients): an honest client's
create/destroy calls in a loop while a `slots` client floods create_session and `--generating`
sessions decode. For each call with no answer within --reply-timeout-s it prints whether the node
handled it (a create is followed by a destroy of the same id: "destroyed" means it was handled)
and whether the answer came late; then a JSON summary with the answered calls' times.

    . scripts/env.sh && .venv/bin/python test/soak/flood_neighbour.py [--bursts 4] [--generating 4]
        [--reply-timeout-s 60] [--service-queue-depth 1000] [--rate-limit-hz 500] [--retry-after-s 10]
With --retry-after-s an unanswered call is re-sent (test/ros/node_harness.py PersistentCall), as the
README advises clients; "lost" then means no copy was answered.
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

from node_harness import NodeProcess, PersistentCall, RosClient, write_params   # noqa: E402

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


def call(client: RosClient, generators: Generators, name: str, session: str, timeout_s: float,
         retry_after_s: float):
    """One honest call, re-sent every retry_after_s unanswered, spinning (and keeping the generators
    busy) until answered; -> (the call, seconds it took, or None if no copy was answered within
    timeout_s)."""
    persistent = PersistentCall(client, name, retry_after_s, session_id=session, owner_key="honest")
    spin_until(client, generators, persistent, time.monotonic() + timeout_s)
    answered = persistent.answer() is not None
    return persistent, (time.monotonic() - persistent.first_sent if answered else None)


def spin_until(client: RosClient, generators: Generators, persistent: PersistentCall, deadline: float) -> None:
    while persistent.answer() is None and time.monotonic() < deadline:
        client.executor.spin_once(timeout_sec=0.02)
        generators.tend()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bursts", type=int, default=4)
    parser.add_argument("--burst-s", type=float, default=15.0)
    parser.add_argument("--generating", type=int, default=4)
    parser.add_argument("--reply-timeout-s", type=float, default=60.0)
    parser.add_argument("--service-queue-depth", type=int, default=1000, help="the node's (replies kept)")
    parser.add_argument("--rate-limit-hz", type=float, default=500.0, help="the node's service_rate_limit_hz")
    parser.add_argument("--client-profile", default="", help="a Fast DDS XML profile for the honest client only")
    parser.add_argument("--retry-after-s", type=float, default=float("inf"),
                        help="re-send an honest call unanswered this long (default: never)")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.client_profile:                   # read when this process creates its participant, below
        os.environ["FASTDDS_DEFAULT_PROFILES_FILE"] = args.client_profile
    with tempfile.TemporaryDirectory() as directory:
        params = write_params(Path(directory), kv_pool_mb=24.0, max_context_tokens=640, max_sessions=12,
                              max_new_tokens=24, status_rate_hz=2.0, service_rate_limit_hz=args.rate_limit_hz, qos_depth=1000,
                              service_queue_depth=args.service_queue_depth)
        node = NodeProcess(params, env)
        client = RosClient(node)
        calls, lost, latencies, resent = 0, [], [], []
        try:
            client.wait_ready()
            generators = Generators(client, args.generating)
            for index in range(args.bursts):
                flood = burst(env, index, args.burst_s)
                i = 0
                while flood.poll() is None:
                    name = "create_session" if i % 2 == 0 else "destroy_session"
                    session = f"honest-{index}-{i // 2}"
                    calls += 1
                    persistent, took = call(client, generators, name, session, args.reply_timeout_s,
                                            args.retry_after_s)
                    if took is not None:
                        latencies.append(took)
                        if persistent.resent:
                            answer = persistent.answer()
                            resent.append({"burst": index, "call": name, "session": session, "took_s": round(took, 1),
                                           "copies": len(persistent.futures), "applied": persistent.applied(answer),
                                           "message": answer.message[:60]})
                            print(f"answered after re-sending: {resent[-1]}", flush=True)
                    else:
                        lost.append({"burst": index, "call": name, "session": session})
                        print(f"no answer: {name} {session} (burst {index})", flush=True)
                        if name == "create_session":
                            # which side lost it: "destroyed" means the node handled the create
                            # and its reply went missing (or is late: waited for below)
                            destroy, _ = call(client, generators, "destroy_session", session, args.reply_timeout_s,
                                              args.retry_after_s)
                            answer = destroy.answer()
                            lost[-1]["destroy_after"] = answer.message if answer is not None else "no answer"
                            i += 1
                        # as long again for a late answer
                        spin_until(client, generators, persistent, time.monotonic() + args.reply_timeout_s)
                        lost[-1]["late_answer"] = persistent.answer() is not None
                        print(f"  {lost[-1]}", flush=True)
                    i += 1
                flood.communicate()
        finally:
            client.close()
            node.stop()
    latencies.sort()
    quantile = lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 3) if latencies else None
    print(json.dumps({"honest_calls": calls, "lost": lost, "answered_after_resending": resent, "answer_s": {"median": quantile(0.5), "p99": quantile(0.99),
                                                                      "max": quantile(1.0)}}))
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
