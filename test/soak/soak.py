"""Soak: the node in its own process, N clients creating, chatting, resetting, cancelling and
destroying sessions at random for a set time, with the checks an operator cares about.

    . scripts/env.sh && python test/soak/soak.py --minutes 30 --sessions 8
Every drain (all sessions destroyed) checks used blocks == idle baseline; at the end: every request
got exactly one final chunk, resident memory slope after warm-up, no traceback or error in the log.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "ros"))
sys.path.insert(0, str(HERE.parents[1]))

from node_harness import NodeProcess, RosClient, write_params   # noqa: E402

QUESTIONS = ["Why is spindle 2 alarming?", "Shut off valve three.", "What does G28 do?", "Home the Z axis.",
             "Alarm 108 after tool change: what now?", "Coolant pressure is 3 bar, is that low?",
             "请检查主轴温度。", "M06 T4 — what happens?"]


class SoakClient:
    """One simulated operator: a session and a small random state machine."""

    def __init__(self, name: str, rng: random.Random):
        self.name, self.rng = name, rng
        self.session = None
        self.pending = None              # (request_id, cancel_at) while a command runs
        self.future = None               # a service call in flight

    def act(self, soak: "Soak") -> None:
        c = soak.client
        if self.future is not None:
            if self.future.done():
                self.future = None
            return
        if self.pending is not None:
            request_id, cancel_at = self.pending
            if any(ch.done for ch in c.chunks_of(request_id)):
                self.pending = None
            elif cancel_at is not None and time.monotonic() > cancel_at:
                self.future = soak.call_async("cancel_generation", session_id=self.session)
                self.pending = (request_id, None)
            return
        roll = self.rng.random()
        if self.session is None:
            self.session = f"{self.name}-{soak.next_id()}"
            self.future = soak.call_async("create_session", session_id=self.session)
        elif roll < 0.65:
            request_id = soak.next_id()
            soak.sent.append(request_id)
            cancel_at = time.monotonic() + self.rng.uniform(0.05, 1.0) if self.rng.random() < 0.15 else None
            c.send(self.session, self.rng.choice(QUESTIONS), request_id,
                   max_new_tokens=self.rng.randint(1, 24), temperature=self.rng.choice([0.0, 0.7]),
                   seed=self.rng.randint(0, 1000))
            self.pending = (request_id, cancel_at)
        elif roll < 0.8:
            self.future = soak.call_async("reset_session", session_id=self.session)
        else:
            self.future = soak.call_async("destroy_session", session_id=self.session)
            self.session = None


class Soak:
    def __init__(self, client: RosClient, sessions: int, seed: int):
        self.client = client
        self.rng = random.Random(seed)
        self.operators = [SoakClient(f"op{i}", random.Random(seed + i)) for i in range(sessions)]
        self.sent: list[int] = []
        self._counter = 10_000
        self.drains: list[dict] = []

    def next_id(self) -> int:
        self._counter += 1
        return self._counter

    def call_async(self, name, **fields):
        return self.client.services[name].call_async(self.client.types[name].Request(**fields))

    def drain(self, baseline_used: int) -> None:
        """Let every operator finish, destroy all sessions, check the pool is back to its baseline."""
        c = self.client
        c.spin_until(lambda: all(o.pending is None or any(ch.done for ch in c.chunks_of(o.pending[0]))
                                 for o in self.operators) and all(o.future is None or o.future.done()
                                                                  for o in self.operators),
                     300, "operators to finish before a drain")
        for operator in self.operators:
            operator.pending, operator.future = None, None
            if operator.session is not None:
                c.call("destroy_session", session_id=operator.session)
                operator.session = None
        pool = c.wait_pool(lambda p: not p.sessions and p.queue_length == 0, "an empty pool after the drain", 60)
        self.drains.append({"t": time.monotonic(), "used_blocks": pool.used_blocks, "rss": pool.rss_bytes})
        assert pool.used_blocks == baseline_used, f"leak: {pool.used_blocks} used blocks, baseline {baseline_used}"

    def run(self, seconds: float, drain_every_s: float) -> dict:
        c = self.client
        baseline = c.latest_pool().used_blocks
        started = time.monotonic()
        next_drain = started + drain_every_s
        while time.monotonic() - started < seconds:
            for operator in self.operators:
                operator.act(self)
            c.executor.spin_once(timeout_sec=0.02)
            if time.monotonic() > next_drain:
                self.drain(baseline)
                next_drain = time.monotonic() + drain_every_s
        self.drain(baseline)
        finals: dict[int, int] = {}
        for chunk in c.chunks:
            if chunk.done:
                finals[chunk.request_id] = finals.get(chunk.request_id, 0) + 1
        missing = [r for r in self.sent if finals.get(r, 0) == 0]
        duplicated = [r for r in self.sent if finals.get(r, 0) > 1]
        reasons: dict[str, int] = {}
        for chunk in c.chunks:
            if chunk.done:
                reasons[chunk.finish_reason] = reasons.get(chunk.finish_reason, 0) + 1
        return {"seconds": time.monotonic() - started, "requests": len(self.sent), "missing_final": missing,
                "duplicate_final": duplicated, "finish_reasons": reasons, "drains": len(self.drains),
                "baseline_used_blocks": baseline, "rss_slope_mib_per_hour": self.rss_slope()}

    def rss_slope(self) -> float:
        """Least-squares slope of RSS over pool_status samples after the first third (warm-up)."""
        samples = [(p.stamp.sec + p.stamp.nanosec * 1e-9, p.rss_bytes) for p in self.client.pools]
        samples = samples[len(samples) // 3:]
        if len(samples) < 3:
            return 0.0
        ts = [t - samples[0][0] for t, _ in samples]
        mean_t, mean_r = sum(ts) / len(ts), sum(r for _, r in samples) / len(samples)
        cov = sum((t - mean_t) * (r - mean_r) for t, (_, r) in zip(ts, samples))
        var = sum((t - mean_t) ** 2 for t in ts) or 1.0
        return cov / var * 3600 / 2**20


def log_problems(log: str) -> list[str]:
    return [line for line in log.splitlines() if "Traceback" in line or "[ERROR]" in line or "[FATAL]" in line]


def soak(seconds: float, sessions: int, seed: int = 1, drain_every_s: float = 20.0, env=None) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        params = write_params(Path(directory), kv_pool_mb=24.0, max_context_tokens=640, max_sessions=sessions,
                              max_new_tokens=24, session_idle_timeout_s=0.0, status_rate_hz=2.0)
        node = NodeProcess(params, env or dict(os.environ))
        client = RosClient(node)
        try:
            client.wait_ready()
            report = Soak(client, sessions, seed).run(seconds, drain_every_s)
        finally:
            client.close()
            node.stop()
        report["log_problems"] = log_problems(node.log())[:20]
        report["node_exit_code"] = node.process.returncode
        return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    report = soak(args.minutes * 60, args.sessions, args.seed)
    print(json.dumps(report, indent=2))
    ok = not report["missing_final"] and not report["duplicate_final"] and not report["log_problems"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
