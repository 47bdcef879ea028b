"""Start edge_slm_node as a user does (`ros2 launch`) and drive it with `ros2` subprocesses."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

import psutil

from node_harness import REPO

CLI_TIMEOUT_S = 60.0
DISCOVERY_SPIN_S = (2.0, 3.0, 5.0, 8.0)    # longer on each try


def ros2_missing_reason() -> str:
    """'' when `ros2 launch` and the ros2 CLI are installed (scripts/setup.sh step 8), else why not."""
    if shutil.which("ros2") is None:
        return "no `ros2` on PATH: scripts/setup.sh installs it from ../shared/ros2-src (or a ROS 2 distribution)"
    try:
        import launch_ros.actions  # noqa: F401
    except ImportError as error:
        return f"`ros2` is there but launch_ros does not import: {error}"
    return ""


class LaunchedNode:
    """`ros2 launch edge_slm_node edge_slm.launch.py ...` in its own process group."""

    def __init__(self, env: dict, namespace: str, params_file, **launch_args):
        self.env = env
        self.namespace = namespace
        self.name = f"/{namespace}/edge_slm_node" if namespace else "/edge_slm_node"
        arguments = [f"namespace:={namespace}", f"params_file:={params_file}"]
        arguments += [f"{key}:={value}" for key, value in launch_args.items()]
        self.output = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(["ros2", "launch", "edge_slm_node", "edge_slm.launch.py", *arguments],
                                        env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=self.output,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        self.output.flush()
        self.output.seek(0)
        return self.output.read()

    def node_pid(self, timeout_s: float = 60.0) -> int:
        """The node process launch started (its child running the edge_slm_node entry)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for child in psutil.Process(self.process.pid).children(recursive=True):
                try:
                    if any("edge_slm_node" in part for part in child.cmdline()[1:3]):
                        return child.pid
                except psutil.NoSuchProcess:
                    pass
            time.sleep(0.1)
        raise AssertionError(f"no node process under ros2 launch after {timeout_s} s:\n{self.log()[-3000:]}")

    def node_rss_mb(self) -> float:
        return psutil.Process(self.node_pid()).memory_info().rss / 2**20

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGINT to the whole group (launch and the node), SIGKILL if it does not end."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGINT)
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)     # whatever is left of the group
        except ProcessLookupError:
            pass
        if self.process.poll() is None:
            self.process.wait(timeout=5)


def ros2(env: dict, *args: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    """One `ros2` command line, as a user types it; -> the finished process (stdout, stderr).

    Without the daemon (which would outlive the test) a verb sees only what it discovers in its
    --spin-time: give it 2 s, and more on each try while it finds no node."""
    for spin_s in DISCOVERY_SPIN_S:
        command = ["ros2", *args]
        if "--no-daemon" in command and "echo" not in command:
            command[command.index("--no-daemon") + 1:1] = ["--spin-time", str(spin_s)]
        result = subprocess.run(command, env=env, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, timeout=timeout)
        if "Node not found" not in result.stderr + result.stdout:
            break
    return result


def timed_ros2(env: dict, *args: str, timeout: float = CLI_TIMEOUT_S):
    started = time.monotonic()
    result = ros2(env, *args, timeout=timeout)
    return result, time.monotonic() - started
