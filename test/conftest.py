"""Shared pytest set-up. Run the suite with `bash scripts/test.sh`, or `. scripts/env.sh` first.

The repo root goes first on sys.path so that tests import `edge_slm_node` from the source
tree even when pytest is started without scripts/env.sh (enough for tests that need no ROS).
"""
import sys
import weakref
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@pytest.fixture(scope="module", autouse=True)
def close_engines_of_module():
    """Every Engine a test module made is closed when the module ends: its side forward threads
    would otherwise keep it, its KV pool and its buffers alive for the rest of the run (the
    suite's single process reached ~100 idle threads). No engine fixture outlives a module."""
    from edge_slm_node.engine.engine import Engine
    made = []
    original_init = Engine.__init__

    def init_and_record(engine, *args, **kwargs):
        original_init(engine, *args, **kwargs)
        made.append(weakref.ref(engine))     # weak: a test may check that a dropped engine is freed

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Engine, "__init__", init_and_record)
        yield
    for engine in filter(None, (ref() for ref in made)):
        engine.close()
