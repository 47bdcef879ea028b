"""Shared pytest set-up. Run the suite with `bash scripts/test.sh`, or `. scripts/env.sh` first.

The repo root goes first on sys.path so that tests import `edge_slm_node` from the source
tree even when pytest is started without scripts/env.sh (enough for tests that need no ROS).
"""
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
