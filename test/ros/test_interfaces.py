"""The built interfaces over the real middleware: this process <-> a peer process."""
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from in_process_node import create_udp_client, fastdds_shared_memory_mappings

PEER_PATH = Path(__file__).with_name('interface_peer.py')
DISCOVERY_TIMEOUT_S = 30.0
REPLY_TIMEOUT_S = 20.0


def load_peer_module():
    spec = importlib.util.spec_from_file_location('interface_peer', PEER_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def peer_process(ros_env):
    """The peer in its own Python process; always stopped, its output kept for failures."""
    with tempfile.TemporaryFile(mode='w+') as output:
        process = subprocess.Popen(
            [sys.executable, str(PEER_PATH), '120'], env=ros_env,
            stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT)
        process.output = output
        try:
            yield process
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5)


def peer_output(process):
    process.output.flush()
    process.output.seek(0)
    return process.output.read()


@pytest.fixture
def ros_node(ros_env):
    """A node in a private context of this process, with its executor."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    context, node = create_udp_client('interface_test_client')
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    try:
        yield node, executor
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def spin_until(executor, process, predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if process.poll() is not None:
            pytest.fail(f'peer exited with {process.returncode} while waiting for {what}:\n'
                        f'{peer_output(process)}')
        if time.monotonic() > deadline:
            pytest.fail(f'timed out after {timeout_s} s waiting for {what}; '
                        f'peer output:\n{peer_output(process)}')
        executor.spin_once(timeout_sec=0.05)


def call(executor, process, client, request, what):
    future = client.call_async(request)
    spin_until(executor, process, future.done, REPLY_TIMEOUT_S, what)
    return future.result()


def test_interfaces_across_processes(peer_process, ros_node):
    from edge_slm_node.msg import Command, PoolStatus, TokenChunk
    from edge_slm_node.srv import CreateSession

    peer = load_peer_module()
    node, executor = ros_node
    ns = peer.NAMESPACE
    chunks, pools, echoes = [], [], []
    node.create_subscription(TokenChunk, f'{ns}/token_chunks', chunks.append, 100)
    node.create_subscription(PoolStatus, f'{ns}/pool_status', pools.append, 10)
    node.create_subscription(Command, f'{ns}/command_echo', echoes.append, 10)
    command_pub = node.create_publisher(Command, f'{ns}/command', 10)
    client = node.create_client(CreateSession, f'{ns}/create_session')

    spin_until(executor, peer_process, client.service_is_ready, DISCOVERY_TIMEOUT_S,
               'the CreateSession service')

    generated_request = CreateSession.Request(
        session_id='', system_prompt='You assist a CNC operator. Ø 12 mm, G01 X10 F200 🙂',
        keep_history=True)
    generated = call(executor, peer_process, client, generated_request, 'CreateSession')
    assert generated == peer.make_create_session_response(generated_request)
    assert generated.session_id == peer.GENERATED_SESSION_ID
    assert generated.prefix_tokens == len(generated_request.system_prompt.encode('utf-8'))

    named_request = CreateSession.Request(session_id='cnc-1', system_prompt='', keep_history=False)
    named = call(executor, peer_process, client, named_request, 'CreateSession')
    assert named == peer.make_create_session_response(named_request)
    assert (named.success, named.session_id) == (True, 'cnc-1')

    # the peer's subscription must be discovered before the command is published
    spin_until(executor, peer_process, lambda: command_pub.get_subscription_count() > 0,
               DISCOVERY_TIMEOUT_S, 'the peer to subscribe to commands')
    command = Command(
        session_id='cnc-1', request_id=2**64 - 2,
        text='G-code: G01 X10.5 Y-3 F200; 主轴 spindle 🙂 done',
        max_new_tokens=4_000_000_000, temperature=0.0, top_k=40, top_p=0.875,
        seed=-(2**63), stop=['<|im_end|>', 'M30', '\n\n'])
    command_pub.publish(command)

    expected_chunks = peer.make_chunks(command)
    spin_until(executor, peer_process,
               lambda: len(chunks) >= len(expected_chunks) and pools and echoes,
               REPLY_TIMEOUT_S, 'token chunks, pool status and command echo')

    assert echoes == [command]
    assert chunks == expected_chunks
    assert [c.seq for c in chunks] == list(range(len(expected_chunks)))
    assert [c.done for c in chunks].count(True) == 1 and chunks[-1].done
    assert ''.join(c.text for c in chunks) == command.text
    assert chunks[-1].finish_reason == 'stop'
    assert chunks[-1].request_id == 2**64 - 2

    assert pools == [peer.make_pool_status([peer.GENERATED_SESSION_ID, 'cnc-1'])]
    pool = pools[0]
    assert [s.session_id for s in pool.sessions] == [peer.GENERATED_SESSION_ID, 'cnc-1']
    assert [s.state for s in pool.sessions] == ['idle', 'queued']
    assert pool.preemptions == 2**64 - 1
    assert (pool.stamp.sec, pool.stamp.nanosec) == (1_700_000_000, 123_456_789)
    # all of it over UDP: the peer (LOCALHOST range, default transports) reached this process's
    # participant, which maps none of Fast DDS's shared memory (in_process_node.py says why)
    assert fastdds_shared_memory_mappings() == []


def test_message_defaults_match_the_contract(ros_interfaces):
    from edge_slm_node.msg import Command, TokenChunk
    from edge_slm_node.srv import CancelGeneration, DestroySession, ResetSession

    command = Command()
    assert (command.max_new_tokens, command.temperature, command.top_k) == (0, -1.0, 0)
    assert (command.top_p, command.seed, list(command.stop)) == (-1.0, -1, [])
    assert TokenChunk().done is False
    for service in (DestroySession, ResetSession):
        assert service.Request.get_fields_and_field_types() == {'session_id': 'string', 'owner_key': 'string'}
        assert service.Response.get_fields_and_field_types() == {
            'success': 'boolean', 'message': 'string', 'freed_blocks': 'uint32'}
    assert CancelGeneration.Response.get_fields_and_field_types() == {
        'success': 'boolean', 'message': 'string'}


def test_install_space_alone_has_interfaces_and_sources(ros_interfaces, tmp_path):
    """What a ROS 2 user gets: the installed package, without the source tree on the path."""
    import edge_slm_node.msg

    # the package directory in the install space (its files may be symlinks: don't resolve)
    install_dir = Path(os.path.abspath(edge_slm_node.msg.__file__)).parent.parent
    env = dict(os.environ, PYTHONPATH=str(install_dir.parent))
    code = ('import edge_slm_node, edge_slm_node.engine, edge_slm_node.ros\n'
            'from edge_slm_node.msg import Command, PoolStatus\n'
            'from edge_slm_node.srv import CreateSession\n'
            'print(edge_slm_node.__path__)\n')
    result = subprocess.run([sys.executable, '-c', code], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == repr([str(install_dir)])
