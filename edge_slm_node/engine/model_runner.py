"""Carries out a StepPlan on the model: batch building, the forward pass, and how decode runs.

A step with prompt chunks runs one forward with the big kernels on numba's thread pool. A
decode-only step runs as DecodePolicy chooses: on the engine thread alone, with the big
matmuls on the thread pool, split into up to num_threads parts, one per thread, each a
whole forward on its sequences (one hand-off per step instead of a pool wake-up per matmul),
or as one forward by a team of the engine thread and the side threads, which split every
matmul's rows and meet at spin barriers in between (one hand-off per step, both cores on
every matmul: what a single decoding session needs).
Every mode gives the same logits: each token carries the shape of the llama.cpp call that
would compute it alone (engine/llama_calls.py), the kernels whose order depends on a call's
size (attention; the K-quant matmuls: Q4_K's 4-token gemm tiles, Q5_K / Q6_K's tiled order) read
it per token, the others compute each row in one order whatever else is in the call, and a
pooled matmul splits rows, never a dot product (bench/check_call_order.py measures it).
"""
from __future__ import annotations

import time
from typing import Optional

import numba
import numpy as np

from ..kernels.team import new_sync
from ..kv.arena import KVArena
from ..kv.block_manager import KVBlockManager
from ..model.buffers import GuardZones
from ..model.loader import LoadedModel
from ..model.transformer import TeamRole, Transformer
from .batch import BatchBuilder
from .config import EngineConfig
from .decode_policy import DecodePolicy, DecodeThreading
from .plan import StepPlan
from .forward_thread import ForwardThread
from .llama_calls import call_shape

WARM_UP_SEQ_KEY = ("warm-up",)           # a throwaway one-token sequence run at start-up


class ModelRunner:
    def __init__(self, model: LoadedModel, config: EngineConfig, arena: KVArena, max_context: int,
                 guards: Optional[GuardZones] = None):
        self.arena = arena
        self.pool_threads = min(config.num_threads, numba.config.NUMBA_NUM_THREADS)
        numba.set_num_threads(self.pool_threads)
        self.max_batch_tokens = config.max_batch_tokens
        max_blocks = -(-max_context // config.block_size)
        self.transformer = Transformer(model.config, model.weights, config.max_batch_tokens, max_context,
                                       max_logits_rows=config.max_running + 1, guards=guards)
        self.batch = BatchBuilder(config.max_batch_tokens, config.max_running + 1, max_blocks)
        self.sides: list[ForwardThread] = []
        if config.max_running >= 2:
            self.sides = [ForwardThread(Transformer(model.config, model.weights, config.max_running, max_context,
                                                    max_logits_rows=config.max_running, guards=guards),
                                      BatchBuilder(config.max_running, config.max_running, max_blocks))
                          for _ in range(config.num_threads - 1)]
        self.decode_policy = DecodePolicy()
        self.split_steps = 0                # decode steps split over the side threads
        self.team_steps = 0                 # decode steps run by a team of this and the side threads
        self.team_sync = new_sync()
        self.last_run = ""                  # what the last step ran (named when a guard zone breaks)
        self.last_batches: list = []        # the ForwardBatches it ran

    def resident_arrays(self) -> list:
        """Weights, KV arena and every activation buffer (what lock_memory pins in RAM)."""
        sides = [a for side in self.sides for a in side.transformer.resident_arrays()]
        return self.transformer.resident_arrays() + sides + [self.arena.storage]

    def close(self) -> None:
        """End the side threads (decode steps then run on the calling thread only)."""
        sides, self.sides = self.sides, []
        for side in sides:
            side.close()

    # ---- a step -------------------------------------------------------------------------------
    def run(self, plan: StepPlan, kv: KVBlockManager):
        """-> logits rows (an array or a list of rows), one per decode request, then one per
        prompt's last chunk, in plan order."""
        self.arena.copy_blocks(plan.copies)
        if plan.prompts:
            self.batch.clear()
            for request in plan.decode:
                self.batch.add(kv, request.session_id, [request.next_token], kv.num_tokens(request.session_id), True)
            for chunk in plan.prompts:
                request = chunk.request
                self.batch.add(kv, request.session_id, chunk.token_ids, chunk.start, chunk.last,
                               calls=request.calls.shapes(chunk.start, chunk.count))
            self.last_run = (f"a prompt step ({sum(c.count for c in plan.prompts)} prompt tokens, {len(plan.decode)} "
                             f"decoding) on the thread pool")
            self.last_batches = [self.batch.build()]
            return self.transformer.forward(self.last_batches[0], self.arena.data, parallel=True)
        mode = self.decode_policy.choose(len(plan.decode), can_split=bool(self.sides),
                                         can_pool=self.pool_threads >= 2, can_team=bool(self.sides))
        parts = min(len(self.sides) + 1, len(plan.decode)) if mode is DecodeThreading.SPLIT else 1
        builders = [self.batch] + [side.batch for side in self.sides[:parts - 1]]
        for index, builder in enumerate(builders):     # near-equal runs of sequences, in order
            builder.clear()
            n = len(plan.decode)
            for request in plan.decode[index * n // parts:(index + 1) * n // parts]:
                builder.add(kv, request.session_id, [request.next_token], kv.num_tokens(request.session_id), True)
        self.last_run = f"a decode step ({len(plan.decode)} sequences, {mode.value}, {parts} part(s))"
        started = time.monotonic()
        self.last_batches = [builder.build() for builder in builders]
        if parts > 1:
            logits = self._split_forward(self.last_batches[0], self.last_batches[1:])
        elif mode is DecodeThreading.TEAM:
            logits = self._team_forward(self.last_batches[0])
        else:
            logits = self.transformer.forward(self.last_batches[0], self.arena.data,
                                              parallel=mode is DecodeThreading.POOL)
        self.decode_policy.record(len(plan.decode), mode, time.monotonic() - started)
        return logits

    def blocks_written(self, copies) -> set:
        """The KV blocks the last step wrote: its batches' slots and the targets of its copies."""
        written = {int(dst) for _, dst in copies}
        for batch in self.last_batches:
            written.update(int(block) for block in np.unique(batch.slot_mapping // self.arena.block_size))
        return written

    def _split_forward(self, batch, side_batches) -> list:
        """Each side batch's forward on its side thread while batch's runs here, all with
        single-threaded kernels; -> logits rows in sequence order (views, nothing allocated)."""
        self.split_steps += 1
        sides = self.sides[:len(side_batches)]
        for side, side_batch in zip(sides, side_batches):
            side.run(side_batch, self.arena.data)
        error, rows = None, []
        try:
            rows += [*self.transformer.forward(batch, self.arena.data, parallel=False)]
        except Exception as exc:
            error = exc
        for side in sides:                  # every side thread is idle again before the step ends
            try:
                rows += [*side.wait()]
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error
        return rows

    def _team_forward(self, batch) -> np.ndarray:
        """batch's one forward run by this thread and every side thread together (TeamRole)."""
        self.team_steps += 1
        members = len(self.sides) + 1
        self.team_sync.fill(0)
        for member, side in enumerate(self.sides, start=1):
            side.run(batch, self.arena.data, TeamRole(member, members, self.transformer, self.team_sync))
        error, logits = None, None
        try:
            logits = self.transformer.forward(batch, self.arena.data, parallel=False,
                                              team=TeamRole(0, members, self.transformer, self.team_sync))
        except Exception as exc:
            error = exc
        for side in self.sides:             # every side thread is idle again before the step ends
            try:
                side.wait()
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error
        return logits

    # ---- start-up -----------------------------------------------------------------------------
    def prefill(self, kv: KVBlockManager, seq_id, token_ids: list, progress=lambda done: None) -> None:
        """Compute the KV of an already reserved sequence's tokens (the shared prompt at start);
        progress(tokens done) after every chunk."""
        start = 0
        while start < len(token_ids):
            chunk = token_ids[start:start + self.max_batch_tokens]
            self.batch.clear()
            shapes = [call_shape(i, len(token_ids)) for i in range(start, start + len(chunk))]
            self.batch.add(kv, seq_id, chunk, start, want_logits=True,
                           calls=([i for i, _ in shapes], [n for _, n in shapes]))
            self.transformer.forward(self.batch.build(), self.arena.data)
            kv.commit(seq_id, chunk)
            start += len(chunk)
            progress(start)

    def warm_up(self, kv: KVBlockManager) -> None:
        """Run one throwaway token every way a step can run (thread pool, one thread, every side
        thread), so kernels are loaded from numba's cache at start-up, not in a user's first step."""
        queries = kv.prefix_query_tokens
        kv.allocate_prompt(WARM_UP_SEQ_KEY, [0])
        kv.prefix_query_tokens = queries                  # not a prompt: keep the hit-rate figures clean
        try:
            for builder in [self.batch] + [side.batch for side in self.sides]:
                builder.clear()
                builder.add(kv, WARM_UP_SEQ_KEY, [0], 0, want_logits=True)
            self.transformer.forward(self.batch.build(), self.arena.data, parallel=False)
            self.transformer.forward(self.batch.build(), self.arena.data, parallel=True)
            for side in self.sides:
                side.run(side.batch.build(), self.arena.data)
            for side in self.sides:
                side.wait()
        finally:
            kv.free(WARM_UP_SEQ_KEY)
