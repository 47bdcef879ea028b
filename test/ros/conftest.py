"""Fixtures for tests that talk ROS 2 across processes."""
import os

import pytest

DOMAIN_ID = 1 + os.getpid() % 200   # one per test run; Fast DDS accepts 0..232


@pytest.fixture
def ros_interfaces():
    """Fails with a hint when the built interfaces are not on the path."""
    try:
        import edge_slm_node.msg  # noqa: F401
        import edge_slm_node.srv  # noqa: F401
    except ImportError as error:
        pytest.fail(f'edge_slm_node interfaces not importable ({error}); '
                    'run `bash scripts/test.sh` or `. scripts/env.sh` first')


@pytest.fixture
def ros_env(ros_interfaces, monkeypatch):
    """Environment for this process and its children: a private domain on loopback only."""
    monkeypatch.setenv('ROS_DOMAIN_ID', str(DOMAIN_ID))
    monkeypatch.setenv('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
    monkeypatch.delenv('ROS_STATIC_PEERS', raising=False)
    monkeypatch.delenv('ROS_LOCALHOST_ONLY', raising=False)
    return dict(os.environ)


@pytest.fixture(scope="module")
def ros_env_module(ros_interfaces_module):
    """Like ros_env, for module-scoped fixtures (a node process shared by a module's tests)."""
    env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN_ID), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    env.pop("ROS_STATIC_PEERS", None)
    env.pop("ROS_LOCALHOST_ONLY", None)
    os.environ.update(ROS_DOMAIN_ID=env["ROS_DOMAIN_ID"], ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    return env


@pytest.fixture(scope="module")
def ros_interfaces_module():
    try:
        import edge_slm_node.msg  # noqa: F401
    except ImportError as error:
        pytest.fail(f"edge_slm_node interfaces not importable ({error}); run `bash scripts/test.sh`")
