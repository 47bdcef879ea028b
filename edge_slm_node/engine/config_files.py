"""Locate the files under config/ in a source tree or in an installed (colcon) package."""
from __future__ import annotations

import os
import sys

PACKAGE = "edge_slm_node"
DEFAULT_SYSTEM_PROMPT_FILE = "cnc_system_prompt.txt"


def config_dir() -> str:
    """config/ next to the sources, else <prefix>/share/edge_slm_node/config."""
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "..", "..", "config")]
    try:
        from ament_index_python.packages import get_package_share_directory
        candidates.append(os.path.join(get_package_share_directory(PACKAGE), "config"))
    except Exception:                      # not on a ROS system, or the package is not installed
        pass
    candidates.append(os.path.join(sys.prefix, "share", PACKAGE, "config"))
    for path in candidates:
        if os.path.isfile(os.path.join(path, DEFAULT_SYSTEM_PROMPT_FILE)):
            return os.path.normpath(path)
    raise FileNotFoundError(f"config directory with {DEFAULT_SYSTEM_PROMPT_FILE} not found (looked in {candidates})")


def read_system_prompt(path: str = "") -> str:
    """The system prompt text from `path`, or the bundled CNC prompt when path is empty."""
    path = path or os.path.join(config_dir(), DEFAULT_SYSTEM_PROMPT_FILE)
    with open(path, encoding="utf-8") as handle:
        text = handle.read().strip()
    if not text:
        raise ValueError(f"system prompt file {path!r} is empty")
    return text


def default_system_prompt() -> str:
    return read_system_prompt("")
