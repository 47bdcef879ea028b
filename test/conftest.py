"""Shared pytest set-up. Run the suite with `bash scripts/test.sh`, or `. scripts/env.sh` first.

The repo root goes first on sys.path so that tests import `edge_slm_node` from the source
tree even when pytest is started without scripts/env.sh (enough for tests that need no ROS).
"""
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@pytest.fixture(scope="module", autouse=True)
def end_side_threads_of_module():
    """Every side forward thread a test module started is ended when the module ends. A thread holds
    its own Transformer (buffers, the weights), not its engine, so an engine a test dropped without
    close() left it running for the rest of the run (~95 idle threads by the ROS tests). No engine
    fixture outlives a module."""
    from edge_slm_node.engine.forward_thread import ForwardThread
    started = []
    original_init = ForwardThread.__init__

    def init_and_record(side, *args, **kwargs):
        original_init(side, *args, **kwargs)
        started.append(side)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ForwardThread, "__init__", init_and_record)
        yield
    for side in started:
        if side.transformer is not None:          # not closed yet
            side.close()
