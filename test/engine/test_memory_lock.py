"""lock_memory: the real mlock(2) of the real model's weights, KV arena and buffers, read back from VmLck."""
import os
import resource
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import run_to_completion
from edge_slm_node.engine.memory_lock import locked_bytes_of_process, lock_arrays, page_ranges, unlock_arrays
from edge_slm_node.engine.sampling import SamplingParams

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def can_lock(nbytes: int) -> bool:
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    return os.geteuid() == 0 or hard == resource.RLIM_INFINITY or hard >= nbytes + locked_bytes_of_process()


def test_page_ranges_merge_overlaps_and_cover_whole_pages():
    storage = np.zeros(3 * 4096 + 100, np.uint8)
    first, second = storage[:5000], storage[4000:9000]
    ranges = page_ranges([first, second, None, storage[:0]])
    assert len(ranges) == 1
    start, end = ranges[0]
    assert start <= first.ctypes.data and end >= second.ctypes.data + second.nbytes
    assert start % 4096 == 0 and end % 4096 == 0
    with pytest.raises(ValueError, match="contiguous"):
        page_ranges([storage[::2]])


def test_lock_arrays_shows_in_vmlck_and_unlocks():
    array = np.ones(4 * 2**20, np.uint8)
    if not can_lock(array.nbytes + 4096):
        pytest.skip("no CAP_IPC_LOCK and RLIMIT_MEMLOCK below 4 MiB")
    before = locked_bytes_of_process()
    locked = lock_arrays([array])
    try:
        assert array.nbytes <= locked <= array.nbytes + 4096
        assert locked_bytes_of_process() >= before + array.nbytes
    finally:
        unlock_arrays([array])
    assert locked_bytes_of_process() <= before + 4096


def test_engine_locks_weights_arena_and_buffers_and_still_answers_the_same(make_engine):
    if not can_lock(400 * 2**20):
        pytest.skip("no CAP_IPC_LOCK and RLIMIT_MEMLOCK below 400 MiB")
    plain, engine = make_engine(), make_engine(lock_memory=True)
    arrays = engine.runner.resident_arrays()
    try:
        stats = engine.stats()
        packed = sum(a.nbytes for linear in engine.model.weights.layer_linears() for a in linear.kernel_arrays())
        assert stats.locked_bytes >= packed + stats.arena_bytes
        assert locked_bytes_of_process() >= stats.locked_bytes
        assert plain.stats().locked_bytes == 0
        answers = []
        for e in (plain, engine):
            e.create_session("s")
            request = e.submit("s", "Why is spindle 2 alarming?", SamplingParams(max_new_tokens=8))
            run_to_completion(e, [request])
            answers.append(request.generated_ids)
        assert answers[0] == answers[1] and len(answers[0]) > 0
    finally:
        unlock_arrays(arrays)


@pytest.mark.skipif(not shutil.which("prlimit") or not shutil.which("setpriv"), reason="needs util-linux")
def test_lock_failure_names_the_limit_and_leaves_nothing_locked():
    script = (
        "from edge_slm_node.engine.config import EngineConfig\n"
        "from edge_slm_node.engine.engine import Engine\n"
        "from edge_slm_node.engine.memory_lock import MemoryLockError, locked_bytes_of_process\n"
        "try:\n"
        "    Engine(EngineConfig(kv_pool_mb=8, max_context_tokens=256, lock_memory=True))\n"
        "except MemoryLockError as error:\n"
        "    print(error)\n"
        "    print('VmLck', locked_bytes_of_process())\n")
    command = ["prlimit", "--memlock=1048576:1048576"]
    if os.geteuid() == 0:             # root would lock anyway: drop CAP_IPC_LOCK for the child
        command += ["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock"]
    result = subprocess.run(command + [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "lock_memory: mlock of" in result.stdout and "RLIMIT_MEMLOCK is 1.0 MiB" in result.stdout, result.stdout
    assert "CAP_IPC_LOCK" in result.stdout
    assert "VmLck 0" in result.stdout
