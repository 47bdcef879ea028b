"""The node in its own process, real rclpy clients here, the real model and real interfaces."""
import os
import resource
import subprocess
import sys

import pytest

from node_harness import REPO, PersistentCall, running_node, write_params

SYSTEM_PROMPT = "You are the assistant of CNC cell 3 (Haas VF-2). Units: mm. Answer briefly."


@pytest.fixture(scope="module")
def node_client(tmp_path_factory, ros_env_module):
    directory = tmp_path_factory.mktemp("node")
    prompt = directory / "prompt.txt"
    prompt.write_text(SYSTEM_PROMPT)
    with running_node(directory, ros_env_module, system_prompt_file=str(prompt)) as client:
        yield client


def assert_well_formed(chunks):
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert [c.done for c in chunks].count(True) == 1 and chunks[-1].done


def test_stream_status_reset_destroy(node_client):
    c = node_client
    baseline = c.latest_pool()
    created = c.call("create_session", session_id="cell3", system_prompt="", keep_history=True)
    assert created.success and created.session_id == "cell3" and created.prefix_tokens > 0
    c.send("cell3", "Why is spindle 2 alarming?", 101, max_new_tokens=6, temperature=0.0)
    chunks = c.wait_done(101)
    assert_well_formed(chunks)
    assert chunks[-1].finish_reason in ("length", "stop") and chunks[-1].error == ""
    assert "".join(ch.text for ch in chunks).strip()
    assert chunks[-1].prompt_tokens > chunks[-1].cached_prompt_tokens >= created.prefix_tokens - 16
    assert chunks[-1].completion_tokens >= 1 and chunks[-1].ttft_ms > 0
    busy = c.wait_pool(lambda p: any(s.session_id == "cell3" and s.num_tokens > created.prefix_tokens
                                     for s in p.sessions), "the session's tokens in pool_status")
    assert busy.used_blocks > baseline.used_blocks
    assert busy.rss_bytes > busy.weights_bytes > 50e6
    reset = c.call("reset_session", session_id="cell3")
    assert reset.success
    destroyed = c.call("destroy_session", session_id="cell3")
    assert destroyed.success and destroyed.freed_blocks > 0
    idle = c.wait_pool(lambda p: not p.sessions, "the session gone from pool_status")
    assert idle.used_blocks == baseline.used_blocks
    assert any(d.status and d.status[0].name.endswith("KV pool") for d in c.diagnostics)


def test_two_sessions_stream_concurrently(node_client):
    c = node_client
    c.send("a-1", "What is G01?", 201, max_new_tokens=8, temperature=0.0)
    c.send("b-1", "Shut off valve three.", 202, max_new_tokens=8, temperature=0.0)
    first, second = c.wait_done(201), c.wait_done(202)
    assert_well_formed(first)
    assert_well_formed(second)
    assert all(ch.session_id == "a-1" for ch in first) and all(ch.session_id == "b-1" for ch in second)
    for sid in ("a-1", "b-1"):
        assert c.call("destroy_session", session_id=sid).success


def test_re_sent_session_calls_are_applied_once(node_client):
    """A client that re-sends an unanswered create or destroy (README, Services) changes the session
    once; the other copies get the answers PersistentCall reads as "an earlier copy was applied"."""
    c = node_client
    baseline = c.latest_pool()
    for name in ("create_session", "destroy_session"):
        call = PersistentCall(c, name, retry_after_s=0.0, session_id="resent", owner_key="k")
        for _ in range(3):                     # no answer can arrive before these copies are sent
            call.answer()
        assert call.resent >= 2
        c.spin_until(lambda: all(f.done() for f in call.futures), 30, f"every copy of {name} answered")
        answers = [f.result() for f in call.futures]
        assert sum(a.success for a in answers) == 1, [a.message for a in answers]
        assert all(call.applied(a) for a in answers), [a.message for a in answers]
        assert [s.session_id for s in c.latest_pool().sessions].count("resent") == (name == "create_session")
    assert c.wait_pool(lambda p: not p.sessions, "no session").used_blocks == baseline.used_blocks


def test_bad_requests_get_clear_errors_and_node_keeps_serving(node_client):
    c = node_client
    before = c.wait_pool(lambda p: not p.sessions and p.queue_length == 0, "an idle pool")
    gone = c.call("destroy_session", session_id="never-created")
    assert not gone.success and "unknown session 'never-created'" in gone.message
    assert not c.call("reset_session", session_id="never-created").success
    cases = [("ok-1", "   ", {}, "empty prompt"),
             ("ok-1", "x" * 4001, {}, "4001 characters"),
             ("ok-1", "hello", {"temperature": 500.0}, "temperature"),
             ("ok-1", "hello", {"top_p": 1.5}, "top_p"),
             ("", "hello", {}, "session_id is empty"),
             ("x" * 10000, "hello", {}, "10000 chars"),
             ("bad id/\u00e9\n", "hello", {}, "invalid")]
    for index, (sid, text, fields, message) in enumerate(cases):
        c.send(sid, text, 300 + index, **fields)
        chunks = c.wait_done(300 + index)
        assert len(chunks) == 1 and chunks[0].finish_reason == "error", chunks
        assert message in chunks[0].error, (message, chunks[0].error)
    assert not c.call("destroy_session", session_id="ok-1").success     # rejected commands create nothing
    c.send("ok-2", "Say hi.", 399, max_new_tokens=3)
    assert c.wait_done(399)[-1].finish_reason in ("length", "stop")
    assert c.call("destroy_session", session_id="ok-2").success
    after = c.wait_pool(lambda p: not p.sessions, "no sessions left")
    assert after.used_blocks == before.used_blocks


@pytest.mark.parametrize("override,message", [({"block_size": 7}, "block_size"),
                                              ({"status_rate_hz": 0.0}, "status_rate_hz"),
                                              ({"model_path": "/nonexistent/model.gguf"}, "model file not found")])
def test_bad_parameters_stop_the_node_at_start(tmp_path, ros_env_module, override, message):
    params = write_params(tmp_path, **override)
    result = subprocess.run([sys.executable, "-m", "edge_slm_node.ros.node", "--ros-args", "--params-file",
                             str(params)], env=ros_env_module, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert message in result.stderr + result.stdout


def test_model_name_not_installed_stops_the_node_with_the_install_command(tmp_path, ros_env_module):
    name = "qwen2.5-coder-1.5b-instruct-q4_k_m"
    params = write_params(tmp_path, model_path=name)
    env = dict(ros_env_module, EDGE_SLM_MODELS_DIR=str(tmp_path / "empty-cache"))
    result = subprocess.run([sys.executable, "-m", "edge_slm_node.ros.node", "--ros-args", "--params-file",
                             str(params)], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert f"`edge-slm models install {name}`" in result.stderr + result.stdout


def test_lock_memory_shows_locked_megabytes_in_diagnostics(tmp_path, ros_env_module):
    if os.geteuid() != 0 and resource.getrlimit(resource.RLIMIT_MEMLOCK)[1] != resource.RLIM_INFINITY:
        pytest.skip("locking the weights needs root / CAP_IPC_LOCK or an unlimited RLIMIT_MEMLOCK")
    # a domain of its own: the module's long-lived node must not answer for this one
    env = dict(ros_env_module, ROS_DOMAIN_ID=str(int(ros_env_module["ROS_DOMAIN_ID"]) + 2))
    with running_node(tmp_path, env, lock_memory=True, max_context_tokens=640) as client:
        client.spin_until(lambda: _diagnostic_value(client, "locked_mb") is not None, 30, "locked_mb in /diagnostics")
        pool = client.latest_pool()
        locked = float(_diagnostic_value(client, "locked_mb")) * 2**20
        arena = pool.total_blocks * pool.bytes_per_block
        assert locked >= 0.9 * pool.weights_bytes + arena, (locked, pool.weights_bytes, arena)
        client.send("s", "Why is spindle 2 alarming?", 1, max_new_tokens=4, temperature=0.0)
        assert client.wait_done(1)[-1].finish_reason in ("length", "stop")


def _diagnostic_value(client, key):
    for array in reversed(client.diagnostics):
        for status in array.status:
            for item in status.values:
                if item.key == key:
                    return item.value
    return None


def test_command_sent_while_autostart_configures_is_served(tmp_path, ros_env_module):
    """The command topic exists from the start; what arrives before the engine is ready is held, then served."""
    from node_harness import NodeProcess, RosClient
    env = dict(ros_env_module, ROS_DOMAIN_ID=str(int(ros_env_module["ROS_DOMAIN_ID"]) + 6))
    node = NodeProcess(write_params(tmp_path, max_context_tokens=640), env)
    client = RosClient(node)
    try:
        client.spin_until(lambda: client.command_publisher.get_subscription_count() > 0
                          and client.node.count_publishers("tokens") > 0, 60, "the command topic")
        client.send("early", "Say hi.", 1, max_new_tokens=2)
        sent_before_ready = not any(p.total_blocks > 0 for p in client.pools)
        chunks = client.wait_done(1)
        assert chunks[-1].finish_reason in ("length", "stop"), chunks[-1]
        assert_well_formed(chunks)
        log = node.log()
        assert "configure: " in log and "activate: " in log
        if not sent_before_ready:
            pytest.skip("the engine was ready before the command went out (nothing was held)")
    finally:
        client.close()
        node.stop()
