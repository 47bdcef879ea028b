"""Greedy decoding through a Transformer with the KV in a scattered block table, as the fidelity
tests against llama.cpp run it."""
from __future__ import annotations

from typing import Optional

import numpy as np

from edge_slm_node.kv.arena import KVArena
from edge_slm_node.model.transformer import ForwardBatch

BLOCK = 16


def scattered_greedy(model, runner, prompt_ids, count: int, blocks: int, chunk: Optional[int] = None,
                     chunks_as_one_call: bool = False):
    """Prefill in chunks of `chunk` tokens (None: one batch) into `blocks` KV blocks in a random
    order, then decode `count` tokens greedily; -> (ids, logits after the prompt). Each chunk is
    summed as llama.cpp sums a call of that many tokens, or with chunks_as_one_call as the whole
    prompt's one call (what the engine's chunked prefill does)."""
    arena = KVArena(model.config.num_layers, model.config.num_kv_heads, model.config.head_dim, num_blocks=blocks,
                    block_size=BLOCK)
    table = np.random.default_rng(len(prompt_ids)).permutation(blocks).astype(np.int32)[None, :]

    def run(tokens, start, in_prompt=False):
        pos = np.arange(start, start + len(tokens), dtype=np.int32)
        slots = (table[0, pos // BLOCK] * BLOCK + pos % BLOCK).astype(np.int32)
        calls = (pos, np.full(len(tokens), len(prompt_ids), np.int32)) if in_prompt and chunks_as_one_call else \
            (None, None)
        batch = ForwardBatch(np.array(tokens, np.int32), pos, np.zeros(len(tokens), np.int32), pos + 1, slots,
                             table, np.array([len(tokens) - 1], np.int32), *calls)
        return runner.forward(batch, arena.data)[0].copy()

    step = chunk or len(prompt_ids)
    for start in range(0, len(prompt_ids), step):
        logits = run(prompt_ids[start:start + step], start, in_prompt=True)
    first_logits = logits
    out = []
    for _ in range(count):
        out.append(int(np.argmax(logits)))
        logits = run([out[-1]], len(prompt_ids) + len(out) - 1)
    return out, first_logits
