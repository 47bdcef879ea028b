"""The shared system prompt's KV kept on disk between runs, so a warm start skips its prefill.

A file is named by a key over everything that KV depends on: the model file (path, size,
mtime), the prompt's token ids, the KV layout (layers, kv heads, head dim, block size, guard
rows) and the compute code (the source of every module under kernels/ and model/ and of the
engine's batching and call shapes, and numba's version). A file that does not match its key
exactly (stale, partial, foreign) is not used: the prompt is prefilled as without a cache, and
the file rewritten. Writes go to a temporary file renamed into place, so a reader never sees a
partial one.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Optional

import numba
import numpy as np

log = logging.getLogger(__name__)

PACKAGE = Path(__file__).resolve().parents[1]
COMPUTE_SOURCES = ("kernels", "model", "engine/batch.py", "engine/llama_calls.py", "engine/model_runner.py")
MAGIC = "edge_slm_node prefix KV v1"


def default_directory() -> str:
    return os.environ.get("EDGE_SLM_PREFIX_KV_DIR") or os.path.join(Path.home(), ".cache", "edge_slm_node",
                                                                   "prefix_kv")


def _source_digest() -> str:
    digest = hashlib.sha256(numba.__version__.encode())
    for entry in COMPUTE_SOURCES:
        root = PACKAGE / entry
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            digest.update(str(path.relative_to(PACKAGE)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_key(model_path: str, token_ids: list, storage_shape: tuple) -> str:
    """-> hex digest naming the file of this prompt's KV for this model, layout and code."""
    stat = os.stat(model_path)
    what = {"magic": MAGIC, "model": os.path.abspath(model_path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "tokens": [int(t) for t in token_ids], "layout": [int(n) for n in storage_shape[:2] + storage_shape[3:]],
            "code": _source_digest()}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


class PrefixKVCache:
    """load / save the KV blocks of one prompt in the arena's storage (its blocks axis, 2)."""

    def __init__(self, directory: str, key: str):
        self.path = os.path.join(directory, f"{key}.npy")
        self.key = key

    def load(self, storage: np.ndarray, blocks: list) -> bool:
        """Copy the cached blocks into storage[:, :, blocks]; False (nothing copied) if there is no
        usable file."""
        try:
            cached = np.load(self.path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as error:
            if not isinstance(error, FileNotFoundError):
                log.warning("prefix KV cache %s unreadable (%s): prefilling instead", self.path, error)
            return False
        expected = storage.shape[:2] + (len(blocks),) + storage.shape[3:]
        if cached.shape != expected or cached.dtype != storage.dtype:
            log.warning("prefix KV cache %s holds %s %s, expected %s %s: prefilling instead", self.path,
                        cached.dtype, cached.shape, storage.dtype, expected)
            return False
        storage[:, :, blocks] = cached
        return True

    def save(self, storage: np.ndarray, blocks: list) -> Optional[str]:
        """Write storage[:, :, blocks] atomically; -> the error text if it could not be written."""
        directory = os.path.dirname(self.path)
        try:
            os.makedirs(directory, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=directory, prefix=".prefix-", suffix=".npy")
            try:
                with os.fdopen(handle, "wb") as out:
                    np.save(out, np.ascontiguousarray(storage[:, :, blocks]), allow_pickle=False)
                os.replace(temporary, self.path)
            except BaseException:
                os.unlink(temporary)
                raise
        except OSError as error:
            log.warning("prefix KV cache %s not written: %s", self.path, error)
            return str(error)
        return None
