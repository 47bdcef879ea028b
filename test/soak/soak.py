"""Soak: the node in its own process, N honest operators creating, chatting, resetting, cancelling
and destroying owned sessions at random, next to hostile clients (test/ros/hostile_client.py:
crash races, forged turns, oversized fields, floods, slot grabbing) taking turns in their own
processes, with the checks an operator cares about.

    . scripts/env.sh && python test/soak/soak.py --minutes 30 --sessions 8 [--no-hostile]
Every drain (all sessions destroyed, hostile clients paused) checks used blocks == idle baseline;
at the end: every honest and every hostile command got exactly one final chunk, every hostile
service call an answer (except the slots and hung clients': they call faster than they read, and
lose their own replies beyond service_queue_depth), every honest operator's service call answered
(re-sent after RETRY_AFTER_S without an answer, as the README advises clients: a flood can lose a
neighbour's call in the middleware; the report lists each re-sent call), the honest first-token
times, the resident memory slope after warm-up, no traceback or error in the log.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "ros"))
sys.path.insert(0, str(HERE.parents[1]))

from node_harness import NodeProcess, PersistentCall, RosClient, write_params   # noqa: E402

HOSTILE = HERE.parent / "ros" / "hostile_client.py"
HOSTILE_MODES = ["race", "inject", "oversized", "flood", "slots", "hung"]
UNREAD_MODES = {"slots", "hung"}   # call faster than they read: replies beyond service_queue_depth are theirs to lose
HOSTILE_RUN_S = 15.0
STALL_TIMEOUT_S = 300.0      # an operator still waiting this long before a drain is a stall
RETRY_AFTER_S = 10.0         # an operator re-sends a session call unanswered this long (as the README advises)

QUESTIONS = ["Why is spindle 2 alarming?", "Shut off valve three.", "What does G28 do?", "Home the Z axis.",
             "Alarm 108 after tool change: what now?", "Coolant pressure is 3 bar, is that low?",
             "请检查主轴温度。", "M06 T4 — what happens?"]


class SoakClient:
    """One simulated operator: a session and a small random state machine."""

    def __init__(self, name: str, rng: random.Random):
        self.name, self.rng = name, rng
        self.session = None
        self.key = f"key-{name}"         # honest operators own their sessions (hostile ones cannot touch them)
        self.pending = None              # (request_id, cancel_at) while a command runs
        self.call = None                 # the session-service call in flight (PersistentCall)

    def act(self, soak: "Soak") -> None:
        c = soak.client
        if self.call is not None:
            answer = self.call.answer()
            if answer is not None:
                name = self.call.name
                if not answer.success and "overloaded" in answer.message:   # a hostile flood spent the rate limit
                    soak.refused[name] = soak.refused.get(name, 0) + 1
                if self.call.resent:
                    soak.resent_calls.append(soak.resent_record(self, answer))
                self.call = None
            return
        if self.pending is not None:
            request_id, cancel_at = self.pending
            if any(ch.done for ch in c.chunks_of(request_id)):
                self.pending = None
            elif cancel_at is not None and time.monotonic() > cancel_at:
                self.start_call(soak, "cancel_generation")
                self.pending = (request_id, None)
            return
        roll = self.rng.random()
        if self.session is None:
            self.session = f"{self.name}-{soak.next_id()}"
            self.start_call(soak, "create_session")
        elif roll < 0.65:
            request_id = soak.next_id()
            soak.sent.append(request_id)
            cancel_at = time.monotonic() + self.rng.uniform(0.05, 1.0) if self.rng.random() < 0.15 else None
            c.send(self.session, self.rng.choice(QUESTIONS), request_id,
                   max_new_tokens=self.rng.randint(1, 24), temperature=self.rng.choice([0.0, 0.7]),
                   seed=self.rng.randint(0, 1000), owner_key=self.key)
            self.pending = (request_id, cancel_at)
        elif roll < 0.8:
            self.start_call(soak, "reset_session")
        else:
            self.start_call(soak, "destroy_session")
            self.session = None

    def start_call(self, soak: "Soak", name: str) -> None:
        """Call one of the session services on this operator's session, keyed."""
        self.call = PersistentCall(soak.client, name, RETRY_AFTER_S, session_id=self.session, owner_key=self.key)
        soak.honest_calls += 1

    def waiting_for(self, client: RosClient) -> dict:
        """What this operator still waits for (empty: nothing)."""
        state = {}
        if self.pending is not None:
            chunks = client.chunks_of(self.pending[0])
            if not any(ch.done for ch in chunks):
                state["command"] = {"request_id": self.pending[0], "session": self.session,
                                    "chunks_seen": len(chunks), "last_seq": chunks[-1].seq if chunks else None}
        if self.call is not None and self.call.answered_copy() is None:
            state["service"] = {"name": self.call.name, "waited_s": round(time.monotonic() - self.call.first_sent, 1),
                                "copies_sent": len(self.call.futures), "session": self.session}
        return state


class Soak:
    def __init__(self, client: RosClient, sessions: int, seed: int, hostile: bool, env: dict):
        self.client = client
        self.rng = random.Random(seed)
        self.operators = [SoakClient(f"op{i}", random.Random(seed + i)) for i in range(sessions)]
        self.sent: list[int] = []
        self._counter = 10_000
        self.drains: list[dict] = []
        self.stalls: list[dict] = []     # drains whose operators were still waiting after STALL_TIMEOUT_S
        self.hostile, self.env = hostile, env
        self.hostile_process = None
        self.hostile_runs: list[dict] = []
        self._hostile_ids = 100_000_000
        self.refused: dict[str, int] = {}   # honest calls answered "overloaded", by service
        self.honest_calls = 0
        self.resent_calls: list[dict] = []  # honest calls answered only after being re-sent

    def next_id(self) -> int:
        self._counter += 1
        return self._counter

    def key_of(self, session_id: str) -> str:
        """The owner key of an honest operator's session ("op3-10042"), "" for anyone else's."""
        return next((o.key for o in self.operators if session_id.startswith(o.name + "-")), "")

    def resent_record(self, operator: SoakClient, answer) -> dict:
        call = operator.call
        return {"t": round(time.monotonic() - self.started, 1), "operator": operator.name, "call": call.name,
                "copies": len(call.futures), "answered_copy": call.answered_copy(),
                "waited_s": round(time.monotonic() - call.first_sent, 1), "applied": call.applied(answer),
                "message": answer.message[:80],
                "after_hostile": self.hostile_runs[-1]["mode"] if self.hostile_runs else None}

    def drain(self, baseline_used: int) -> None:
        """Let every operator finish, destroy all sessions, check the pool is back to its baseline."""
        c = self.client
        try:
            c.spin_until(lambda: not any(o.waiting_for(c) for o in self.operators), STALL_TIMEOUT_S,
                         "operators to finish before a drain")
        except AssertionError:                   # recorded (the run fails) and the soak goes on
            waiting = {o.name: o.waiting_for(c) for o in self.operators}
            self.stalls.append({"t": round(time.monotonic() - self.started, 1),
                                "after_hostile": self.hostile_runs[-1]["mode"] if self.hostile_runs else None,
                                "waiting": {name: state for name, state in waiting.items() if state}})
        for operator in self.operators:
            operator.pending, operator.call = None, None
            if operator.session is not None:
                c.call_persistently("destroy_session", RETRY_AFTER_S, session_id=operator.session,
                                    owner_key=operator.key)
                operator.session = None
        # what the hostile clients left behind, and honest sessions whose destroy was refused as overloaded
        for session in c.latest_pool().sessions:
            c.call_persistently("destroy_session", RETRY_AFTER_S, session_id=session.session_id,
                                owner_key=self.key_of(session.session_id))
        pool = c.wait_pool(lambda p: not p.sessions and p.queue_length == 0, "an empty pool after the drain", 60)
        self.drains.append({"t": time.monotonic(), "used_blocks": pool.used_blocks, "rss": pool.rss_bytes})
        assert pool.used_blocks == baseline_used, f"leak: {pool.used_blocks} used blocks, baseline {baseline_used}"

    def run(self, seconds: float, drain_every_s: float) -> dict:
        c = self.client
        baseline = c.latest_pool().used_blocks
        started = self.started = time.monotonic()
        next_drain = started + drain_every_s
        while time.monotonic() - started < seconds:
            for operator in self.operators:
                operator.act(self)
            c.executor.spin_once(timeout_sec=0.02)
            hostile_running = self.tend_hostile(stop=time.monotonic() > next_drain)
            if time.monotonic() > next_drain and not hostile_running:
                self.drain(baseline)
                next_drain = time.monotonic() + drain_every_s
        while self.tend_hostile(stop=True):
            c.executor.spin_once(timeout_sec=0.05)
        self.drain(baseline)
        finals: dict[int, int] = {}
        for chunk in c.chunks:
            if chunk.done:
                finals[chunk.request_id] = finals.get(chunk.request_id, 0) + 1
        missing = [r for r in self.sent if finals.get(r, 0) == 0]
        duplicated = [r for r in self.sent if finals.get(r, 0) > 1]
        honest = set(self.sent)
        reasons: dict[str, int] = {}
        errors: dict[str, int] = {}
        ttfts = []
        for chunk in c.chunks:
            if chunk.done and chunk.request_id in honest:
                reasons[chunk.finish_reason] = reasons.get(chunk.finish_reason, 0) + 1
                if chunk.ttft_ms > 0:
                    ttfts.append(chunk.ttft_ms)
                if chunk.error:
                    errors[chunk.error[:70]] = errors.get(chunk.error[:70], 0) + 1
        hostile_sent = [r for run in self.hostile_runs for r in run["sent"]]
        ttfts.sort()
        return {"seconds": time.monotonic() - started, "requests": len(self.sent), "missing_final": missing,
                "duplicate_final": duplicated, "stalls": self.stalls, "honest_refused_overloaded": self.refused,
                "honest_calls": self.honest_calls, "honest_calls_resent": self.resent_calls,
                "finish_reasons": reasons, "errors": errors, "drains": len(self.drains),
                "honest_ttft_ms": {"median": statistics.median(ttfts) if ttfts else 0.0,
                                   "p95": ttfts[int(0.95 * (len(ttfts) - 1))] if ttfts else 0.0,
                                   "max": ttfts[-1] if ttfts else 0.0},
                "hostile": {"runs": [r["mode"] for r in self.hostile_runs], "commands": len(hostile_sent),
                            "missing_final": [r for r in hostile_sent if finals.get(r, 0) == 0][:20],
                            "duplicate_final": [r for r in hostile_sent if finals.get(r, 0) > 1][:20],
                            "service_calls": sum(r["calls"] for r in self.hostile_runs if r["mode"] not in UNREAD_MODES),
                            "service_answers": sum(r["answers"] for r in self.hostile_runs
                                                   if r["mode"] not in UNREAD_MODES),
                            "unread_calls": sum(r["calls"] for r in self.hostile_runs if r["mode"] in UNREAD_MODES)},
                "baseline_used_blocks": baseline, "rss_slope_mib_per_hour": self.rss_slope()}

    def tend_hostile(self, stop: bool) -> bool:
        """Collect a finished hostile client, start the next mode unless stopping; -> one is running."""
        if self.hostile_process is not None and self.hostile_process.poll() is not None:
            out, err = self.hostile_process.communicate()
            if self.hostile_process.returncode != 0:
                raise AssertionError(f"hostile client failed:\n{err[-2000:]}")
            self.hostile_runs.append(json.loads(out.strip().splitlines()[-1]))
            self.hostile_process = None
        if self.hostile and self.hostile_process is None and not stop:
            mode = HOSTILE_MODES[len(self.hostile_runs) % len(HOSTILE_MODES)]
            self._hostile_ids += 1_000_000
            self.hostile_process = subprocess.Popen(
                [sys.executable, str(HOSTILE), mode, "--seconds", str(HOSTILE_RUN_S), "--first-id",
                 str(self._hostile_ids), "--session", f"hostile-{mode}", "--seed", str(len(self.hostile_runs)),
                 "--hang-s", str(HOSTILE_RUN_S)],
                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return self.hostile_process is not None

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


def soak(seconds: float, sessions: int, seed: int = 1, drain_every_s: float = 20.0, env=None,
         hostile: bool = True) -> dict:
    env = env or dict(os.environ)
    with tempfile.TemporaryDirectory() as directory:
        # room for the honest sessions plus a few anonymous ones, which evict each other
        params = write_params(Path(directory), kv_pool_mb=24.0, max_context_tokens=640, max_sessions=sessions + 4,
                              max_new_tokens=24, session_idle_timeout_s=0.0, status_rate_hz=2.0,
                              service_rate_limit_hz=500.0, qos_depth=1000, guard_zones=True)
        node = NodeProcess(params, env)
        client = RosClient(node)
        try:
            client.wait_ready()
            report = Soak(client, sessions, seed, hostile, env).run(seconds, drain_every_s)
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
    parser.add_argument("--no-hostile", action="store_true", help="honest operators only")
    args = parser.parse_args()
    report = soak(args.minutes * 60, args.sessions, args.seed, hostile=not args.no_hostile)
    print(json.dumps(report, indent=2))
    hostile = report["hostile"]
    ok = (not report["missing_final"] and not report["duplicate_final"] and not report["stalls"]
          and not report["log_problems"]
          and not hostile["missing_final"] and not hostile["duplicate_final"]
          and hostile["service_calls"] == hostile["service_answers"] and report["node_exit_code"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
