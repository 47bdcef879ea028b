"""Import edge_slm_node as of another git revision, next to the working tree's, for before/after
timings in one process (same machine state, interleaved)."""
from __future__ import annotations

import importlib
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile

REPO_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def load_baseline(rev: str, *modules: str):
    """edge_slm_node at git revision `rev`, copied to a temporary directory as the package
    edge_slm_node_baseline -> its submodules `modules` (e.g. "kernels.attention")."""
    archive = subprocess.run(["git", "-C", REPO_ROOT, "archive", rev, "edge_slm_node"], check=True,
                             capture_output=True).stdout
    target = tempfile.mkdtemp(prefix="bench_baseline_")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target)
    package = os.path.join(target, "edge_slm_node_baseline")
    os.rename(os.path.join(target, "edge_slm_node"), package)
    for folder, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as handle:
                    text = handle.read()
                with open(path, "w") as handle:
                    handle.write(re.sub(r"\bedge_slm_node\b", "edge_slm_node_baseline", text))
    sys.path.insert(0, target)
    return tuple(importlib.import_module(f"edge_slm_node_baseline.{m}") for m in modules)
