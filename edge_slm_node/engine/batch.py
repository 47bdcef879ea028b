"""Assemble ForwardBatch arrays for a step into buffers allocated once."""
from __future__ import annotations

import numpy as np

from ..kv.block_manager import KVBlockManager
from ..model.transformer import ForwardBatch
from .llama_calls import DECODED


class BatchBuilder:
    """Collects (sequence, tokens, start position) entries and produces a ForwardBatch view."""

    def __init__(self, max_tokens: int, max_sequences: int, max_blocks_per_seq: int):
        self.token_ids = np.zeros(max_tokens, np.int32)
        self.positions = np.zeros(max_tokens, np.int32)
        self.token_seq = np.zeros(max_tokens, np.int32)
        self.token_context = np.zeros(max_tokens, np.int32)
        self.slot_mapping = np.zeros(max_tokens, np.int32)
        self.block_tables = np.zeros((max_sequences, max_blocks_per_seq), np.int32)
        self.logits_rows = np.zeros(max_sequences, np.int32)
        self.call_index = np.zeros(max_tokens, np.int32)
        self.call_length = np.zeros(max_tokens, np.int32)
        self.max_tokens = max_tokens
        self.clear()

    def clear(self) -> None:
        self.num_tokens = 0
        self.num_sequences = 0
        self.num_logits = 0

    def add(self, manager: KVBlockManager, seq_id, tokens: list, start: int, want_logits: bool,
            calls: tuple = None) -> int:
        """Queue tokens for positions [start, start+len); returns the logits row or -1.

        calls: (indexes, lengths), each token's llama.cpp call (engine/llama_calls.py); by
        default each token is a call of its own (decoded tokens)."""
        n, t0, s = len(tokens), self.num_tokens, self.num_sequences
        if t0 + n > self.max_tokens:
            raise ValueError(f"batch overflow: {t0} + {n} tokens > {self.max_tokens}")
        table = manager.block_table(seq_id)
        self.block_tables[s, :len(table)] = table
        self.token_ids[t0:t0 + n] = tokens
        self.positions[t0:t0 + n] = np.arange(start, start + n, dtype=np.int32)
        self.token_seq[t0:t0 + n] = s
        self.token_context[t0:t0 + n] = self.positions[t0:t0 + n] + 1
        self.slot_mapping[t0:t0 + n] = manager.slot_mapping(seq_id, start, n)
        if calls is None:
            self.call_index[t0:t0 + n], self.call_length[t0:t0 + n] = DECODED
        else:
            self.call_index[t0:t0 + n], self.call_length[t0:t0 + n] = calls
        self.num_tokens += n
        self.num_sequences += 1
        if not want_logits:
            return -1
        self.logits_rows[self.num_logits] = t0 + n - 1
        self.num_logits += 1
        return self.num_logits - 1

    def build(self) -> ForwardBatch:
        t = self.num_tokens
        return ForwardBatch(self.token_ids[:t], self.positions[:t], self.token_seq[:t],
                            self.token_context[:t], self.slot_mapping[:t],
                            self.block_tables[:self.num_sequences], self.logits_rows[:self.num_logits],
                            self.call_index[:t], self.call_length[:t])
