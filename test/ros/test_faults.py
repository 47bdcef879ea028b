"""Faults against the node process: vanished clients, cancel, floods, limits, expiry, signals, budget."""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from node_harness import LONG_ANSWER, REPO, NodeProcess, RosClient, counting_grammar, running_node, write_params

LONG_GRAMMAR = counting_grammar(200)


def release(client, session_id):
    """Destroy a session; on a slow machine it may already have expired (idle timeout 20 s)."""
    reply = client.call("destroy_session", session_id=session_id)
    assert reply.success or f"unknown session {session_id!r}" in reply.message, reply.message


@pytest.fixture(scope="module")
def faulty(tmp_path_factory, ros_env_module):
    with running_node(tmp_path_factory.mktemp("faults"), ros_env_module, max_sessions=4, max_new_tokens=200,
                      session_idle_timeout_s=20.0, auto_session_idle_timeout_s=20.0, max_context_tokens=640, kv_pool_mb=32.0,
                      max_pending_per_session=4, max_queued_requests=16, max_input_chars=1000) as client:
        yield client


def test_client_vanishing_mid_stream_changes_nothing(faulty, ros_env_module):
    c = faulty
    baseline = c.latest_pool()
    script = ("import sys, time, rclpy\n"
              "from edge_slm_node.msg import Command\n"
              "rclpy.init(); n = rclpy.create_node('doomed')\n"
              "p = n.create_publisher(Command, 'command', 10)\n"
              "while p.get_subscription_count() == 0: rclpy.spin_once(n, timeout_sec=0.1)\n"
              "time.sleep(0.5); p.publish(Command(session_id='doomed', request_id=7, text=sys.argv[1], max_new_tokens=40))\n"
              "time.sleep(0.5); print('sent', flush=True); time.sleep(60)\n")
    doomed = subprocess.Popen([sys.executable, "-c", script, LONG_ANSWER], env=ros_env_module,
                              stdout=subprocess.PIPE, text=True)
    assert doomed.stdout.readline().strip() == "sent"
    c.spin_until(lambda: any(ch.request_id == 7 for ch in c.chunks), 120, "the doomed client's first chunk")
    doomed.kill()
    doomed.wait()
    assert c.wait_done(7)[-1].finish_reason in ("length", "stop")
    c.send("alive", "Say hi.", 8, max_new_tokens=3)
    assert c.wait_done(8)[-1].finish_reason in ("length", "stop")
    for sid in ("doomed", "alive"):
        release(c, sid)
    assert c.wait_pool(lambda p: not p.sessions, "sessions gone").used_blocks == baseline.used_blocks


def test_cancel_during_decode_frees_blocks(faulty):
    c = faulty
    c.send("cancel-me", LONG_ANSWER, 20, max_new_tokens=200, temperature=0.0, grammar=LONG_GRAMMAR)
    c.spin_until(lambda: len(c.chunks_of(20)) >= 3, 120, "decoding to start")
    during = c.wait_pool(lambda p: any(s.session_id == "cancel-me" and s.state == "decode" for s in p.sessions),
                         "the session decoding in pool_status", 60)
    reply = c.call("cancel_generation", session_id="cancel-me")
    assert reply.success
    chunks = c.wait_done(20)
    assert chunks[-1].finish_reason == "cancelled"
    assert [ch.seq for ch in chunks] == list(range(len(chunks)))
    after = c.wait_pool(lambda p: all(s.state == "idle" for s in p.sessions), "idle session")
    session = next(s for s in after.sessions if s.session_id == "cancel-me")
    assert session.num_tokens == chunks[-1].cached_prompt_tokens        # the cancelled turn's KV is gone
    assert session.num_tokens < max(s.num_tokens for s in during.sessions if s.session_id == "cancel-me")
    release(c, "cancel-me")


def test_destroy_during_generation(faulty):
    c = faulty
    baseline_used = c.wait_pool(lambda p: not p.sessions, "no sessions").used_blocks
    c.send("kill-me", LONG_ANSWER, 30, max_new_tokens=200, grammar=LONG_GRAMMAR)
    c.spin_until(lambda: len(c.chunks_of(30)) >= 2, 120, "decoding to start")
    reply = c.call("destroy_session", session_id="kill-me")
    assert reply.success and reply.freed_blocks > 0
    assert c.wait_done(30)[-1].finish_reason == "cancelled"
    assert c.wait_pool(lambda p: not p.sessions, "session gone").used_blocks == baseline_used


def test_max_sessions_and_hostile_text(faulty):
    c = faulty
    names = [f"full-{i}" for i in range(4)]
    try:
        for name in names:
            assert c.call("create_session", session_id=name).success
        evicted_before = c.latest_pool().sessions_evicted
        assert c.call("create_session", session_id="one-too-many").success      # the oldest idle one goes
        pool = c.wait_pool(lambda p: p.sessions_evicted == evicted_before + 1, "the eviction on pool_status")
        assert sorted(s.session_id for s in pool.sessions) == sorted(names[1:] + ["one-too-many"])
        names[0] = "one-too-many"
        duplicate = c.call("create_session", session_id="full-1")
        assert not duplicate.success and "already exists" in duplicate.message
        c.send("full-0", "x" * 1_000_000, 40)
        assert "1000000 characters" in c.wait_done(40)[-1].error
        # control characters, escape sequences and bidi overrides are just text (ROS strings cannot carry NUL)
        c.send("full-1", "\x07\x1b[2J valve \u202e three \x7f", 41, max_new_tokens=4)
        assert c.wait_done(41)[-1].finish_reason in ("length", "stop")
    finally:
        for name in names:
            release(c, name)


def test_command_flood_is_bounded_and_every_command_is_answered(faulty):
    c = faulty
    ids = list(range(1000, 2000))
    started = time.monotonic()
    for request_id in ids:
        c.send("flood", "Say hi.", request_id, max_new_tokens=1)
        if request_id % 100 == 0:
            c.executor.spin_once(timeout_sec=0)
    sent_in = time.monotonic() - started
    c.spin_until(lambda: sum(1 for ch in c.chunks if ch.done and 1000 <= ch.request_id < 2000) >= len(ids), 600,
                 "a final chunk for every flooded command")
    finals = [ch for ch in c.chunks if ch.done and 1000 <= ch.request_id < 2000]
    assert sorted(ch.request_id for ch in finals) == ids                  # exactly one each
    errors = [ch for ch in finals if ch.finish_reason == "error"]
    assert errors and all("queued requests" in ch.error or "queue full" in ch.error for ch in errors)
    assert len(finals) - len(errors) >= 4                                # the bounded queue was served
    assert sent_in < 30
    release(c, "flood")


def test_idle_session_expires_and_shows_on_status(faulty):
    c = faulty
    c.send("sleepy", "Say hi.", 50, max_new_tokens=2)
    c.wait_done(50)
    c.wait_pool(lambda p: any(s.session_id == "sleepy" for s in p.sessions), "the session")
    c.wait_pool(lambda p: not any(s.session_id == "sleepy" for s in p.sessions), "the session to expire", 90)
    assert not c.call("destroy_session", session_id="sleepy").success


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_the_node_mid_generation(tmp_path, ros_env_module, sig):
    # a domain of its own: the module's long-lived node must not answer for this one
    env = dict(ros_env_module, ROS_DOMAIN_ID=str(int(ros_env_module["ROS_DOMAIN_ID"]) + 1))
    node = NodeProcess(write_params(tmp_path, max_new_tokens=200, max_context_tokens=640, kv_pool_mb=32.0), env)
    client = RosClient(node)
    try:
        client.wait_ready()
        client.send("s", LONG_ANSWER, 60, max_new_tokens=200, grammar=LONG_GRAMMAR)
        client.spin_until(lambda: len(client.chunks_of(60)) >= 2, 120, "decoding to start")
        took = node.stop(sig, timeout=10)
        assert node.process.returncode in (0, -sig, 128 + sig), node.log()[-2000:]
        assert took < 2.0, f"stopping took {took:.2f} s"
        assert "Traceback" not in node.log()
    finally:
        client.close()
        node.stop()


def test_memory_budget_refuses_to_start_with_figures(tmp_path, ros_env_module):
    params = write_params(tmp_path, memory_cap_fraction=0.001)
    result = subprocess.run([sys.executable, "-m", "edge_slm_node.ros.node", "--ros-args", "--params-file",
                             str(params)], env=ros_env_module, cwd=REPO, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "memory budget exceeded" in output and "weights" in output and "MemAvailable" in output


def test_corrupt_model_file_stops_at_start(tmp_path, ros_env_module):
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + b"\xff" * 64)
    params = write_params(tmp_path, model_path=str(corrupt))
    result = subprocess.run([sys.executable, "-m", "edge_slm_node.ros.node", "--ros-args", "--params-file",
                             str(params)], env=ros_env_module, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "corrupt.gguf" in result.stderr and "GGUF" in result.stderr


@pytest.mark.skipif(not shutil.which("prlimit") or not shutil.which("setpriv"), reason="needs util-linux")
def test_lock_memory_without_privilege_refuses_to_start(tmp_path, ros_env_module):
    params = write_params(tmp_path, lock_memory=True, max_context_tokens=640)
    command = ["prlimit", "--memlock=1048576:1048576"]
    if os.geteuid() == 0:             # root would lock anyway: drop CAP_IPC_LOCK for the node
        command += ["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock"]
    result = subprocess.run(command + [sys.executable, "-m", "edge_slm_node.ros.node", "--ros-args", "--params-file",
                                       str(params)], env=ros_env_module, cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "lock_memory: mlock of" in output and "RLIMIT_MEMLOCK is 1.0 MiB" in output, output[-2000:]
