"""A second forward pass on a thread of its own: for half of a decode step's sequences, or as a
member of a team running one forward together (model/transformer.py TeamRole)."""
from __future__ import annotations

import threading
from typing import Optional

import numpy as np

from ..model.transformer import ForwardBatch, TeamRole, Transformer
from .batch import BatchBuilder


class ForwardThread:
    """Owns a Transformer (its own activation buffers, the shared weights), a BatchBuilder and one
    daemon thread. run() starts batch on that thread; wait() returns its logits or re-raises;
    close() ends the thread, after which nothing of it holds the weights or the KV arena."""

    def __init__(self, transformer: Transformer, batch: BatchBuilder):
        self.transformer = transformer
        self.batch = batch
        self._job = None
        self._result = None
        self._error = None
        self._start = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="edge_slm_side_forward", daemon=True)
        self._thread.start()

    def run(self, batch: ForwardBatch, kv_arena: np.ndarray, team: Optional[TeamRole] = None) -> None:
        self._job = (batch, kv_arena, team)
        self._done.clear()
        self._start.set()

    def wait(self) -> np.ndarray:
        self._done.wait()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self._result

    def close(self) -> None:
        self._job = None
        self._start.set()
        self._thread.join()
        self.transformer = self.batch = self._result = self._error = None

    def _loop(self) -> None:
        while True:
            self._start.wait()
            self._start.clear()
            if self._job is None:                 # close()
                return
            self._forward(*self._job)
            self._done.set()

    def _forward(self, batch: ForwardBatch, kv_arena: np.ndarray, team: Optional[TeamRole]) -> None:
        # a frame of its own: no local of the loop keeps the last job's arrays alive
        try:
            self._result = self.transformer.forward(batch, kv_arena, parallel=False, team=team)
        except Exception as error:            # handed to the engine thread by wait()
            self._result, self._error = None, error
