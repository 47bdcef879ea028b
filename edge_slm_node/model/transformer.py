"""The decoder forward pass over a batch of tokens from one or more sequences (paged KV)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..kernels import ops
from ..kernels.attention import attention_work, paged_attention, write_kv
from ..kernels.half import HALF_TO_FLOAT
from ..kernels.repack import gather_rows_q8_0
from .buffers import resident_zeros
from .config import ModelConfig
from .linear import FusedLinear, PreparedInput
from .quant import Q8_0, dequantize
from .serial_layers import SerialLayers
from .weights import ModelWeights


@dataclass
class ForwardBatch:
    """Which tokens to run and where their KV lives; all arrays int32.

    token_ids, positions, token_seq (row into block_tables), token_context (positions the token
    attends to, itself included), slot_mapping (arena slot its KV is written to): shape (T,).
    block_tables (S, max_blocks). logits_rows: indices into T whose logits are wanted.
    batched (T,) optional: nonzero where a token's attention is summed in the order llama.cpp
    uses for a multi-token batch (a prompt) rather than for one token (decode); by default a
    token is batched when its sequence has two or more tokens in this batch, which is
    llama.cpp's rule for one sequence (see kernels/attention.py).
    """
    token_ids: np.ndarray
    positions: np.ndarray
    token_seq: np.ndarray
    token_context: np.ndarray
    slot_mapping: np.ndarray
    block_tables: np.ndarray
    logits_rows: np.ndarray
    batched: Optional[np.ndarray] = None


def batched_tokens(token_seq: np.ndarray, num_sequences: int) -> np.ndarray:
    """(T,) uint8: 1 where the token's sequence has at least two tokens in the batch."""
    counts = np.bincount(token_seq, minlength=num_sequences)
    return (counts[token_seq] >= 2).astype(np.uint8)


class Transformer:
    """Runs ModelWeights; owns every activation buffer (allocated once for max_batch_tokens)."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, max_batch_tokens: int,
                 max_context: int, max_logits_rows: int):
        self.config = config
        self.weights = weights
        self.max_batch_tokens = max_batch_tokens
        self.max_context = max_context
        c, t = config, max_batch_tokens
        f32 = np.float32
        zeros = resident_zeros
        self.hidden = zeros((t, c.hidden_size), f32)
        self.normed = zeros((t, c.hidden_size), f32)
        self.q = zeros((t, c.q_size), f32)
        self.k = zeros((t, c.kv_size), f32)
        self.v = zeros((t, c.kv_size), f32)
        self.attn = zeros((t, c.q_size), f32)
        self.proj = zeros((t, c.hidden_size), f32)
        self.gate = zeros((t, c.intermediate_size), f32)
        self.up = zeros((t, c.intermediate_size), f32)
        self.logits = zeros((max_logits_rows, c.vocab_size), f32)
        self.final_normed = zeros((max_logits_rows, c.hidden_size), f32)
        layer0 = weights.layers[0]
        # q|k|v and gate|up each run as one kernel call over concatenated packed rows (one thread
        # wake-up and one pass over the shared input instead of three / two); same results.
        self.qkv = [FusedLinear([l.q, l.k, l.v]) for l in weights.layers]
        self.gate_up = [FusedLinear([l.gate, l.up]) for l in weights.layers]
        self.normed_input = PreparedInput(t, c.hidden_size, layer0.q.needs_q8, layer0.q.needs_half)
        self.attn_input = PreparedInput(t, c.q_size, layer0.o.needs_q8, layer0.o.needs_half)
        self.ffn_input = PreparedInput(t, c.intermediate_size, layer0.down.needs_q8, layer0.down.needs_half)
        self.output_input = PreparedInput(max_logits_rows, c.hidden_size, weights.output.needs_q8,
                                          weights.output.needs_half)
        self.rope_cos, self.rope_sin = ops.rope_tables(max_context, c.rotary_dims, c.rope_freq_base)
        self.attention_work = attention_work(c.num_heads, c.num_kv_heads, c.head_dim, max_context)
        self.kv_row = np.zeros(c.head_dim, f32)
        self.kv_half_bits = np.zeros(8, np.uint16)
        self.attention_scale = np.float32(1.0) / np.sqrt(np.float32(c.head_dim))   # 1.0f/sqrtf(d) as llama.cpp
        # A tied Q8_0 embedding is read from the output head's packed rows: the repack released
        # the file pages of the GGUF copy, and each new token id would page-fault on them.
        self.embedding_from_head = (weights.embedding_quant is Q8_0 and weights.output.raw is weights.embedding_raw
                                    and weights.output.packed is not None)
        self.serial_layers = SerialLayers.build(self)

    def resident_arrays(self) -> list:
        """Every array a forward pass reads or writes: weights and buffers (to lock them in RAM)."""
        w = self.weights
        arrays = [w.output_norm, *w.output.kernel_arrays()]
        if not self.embedding_from_head:
            arrays.append(w.embedding_raw)
        for layer in w.layers:
            arrays += [layer.attn_norm, layer.ffn_norm, layer.q_bias, layer.k_bias, layer.v_bias]
        for linear in w.layer_linears():
            arrays += linear.kernel_arrays()
        arrays += [self.hidden, self.normed, self.q, self.k, self.v, self.attn, self.proj, self.gate, self.up,
                   self.logits, self.final_normed, self.rope_cos, self.rope_sin, self.attention_work,
                   self.kv_row, self.kv_half_bits]
        for prepared in (self.normed_input, self.attn_input, self.ffn_input, self.output_input):
            arrays += prepared.buffers()
        if self.serial_layers is not None:
            arrays += self.serial_layers.own_arrays()
        return [a for a in arrays if a is not None]

    def embed(self, token_ids: np.ndarray, out: np.ndarray) -> None:
        w = self.weights
        if self.embedding_from_head:
            gather_rows_q8_0(w.output.packed, w.output.tail, token_ids, HALF_TO_FLOAT, out)
        elif w.embedding_quant is Q8_0:
            ops.embed_q8_0(w.embedding_raw, token_ids, HALF_TO_FLOAT, out)
        else:
            out[:] = dequantize(w.embedding_raw[token_ids], w.embedding_quant)

    @property
    def runs_single_threaded(self) -> bool:
        """forward(parallel=False) keeps to the calling thread (every weight has a serial kernel), so
        two Transformers on the same weights can run side by side on two threads."""
        w = self.weights
        return all(linear.packed is not None for linear in [w.output, *w.layer_linears()])

    def forward(self, batch: ForwardBatch, kv_arena: np.ndarray, parallel: bool = True) -> np.ndarray:
        """Run the tokens, write their KV into kv_arena (layers, 2, blocks, block_size, kv_heads,
        head_dim) u16 (KVArena.data), return logits (len(logits_rows), vocab) — a view of an internal buffer.
        parallel=False: every kernel on the calling thread (see runs_single_threaded)."""
        c = self.config
        num_tokens = batch.token_ids.shape[0]
        if num_tokens > self.max_batch_tokens:
            raise ValueError(f"batch has {num_tokens} tokens, engine buffers hold {self.max_batch_tokens}")
        hidden, normed = self.hidden[:num_tokens], self.normed[:num_tokens]
        q, k, v = self.q[:num_tokens], self.k[:num_tokens], self.v[:num_tokens]
        attn, proj = self.attn[:num_tokens], self.proj[:num_tokens]
        gate, up = self.gate[:num_tokens], self.up[:num_tokens]
        heads_q = q.reshape(num_tokens, c.num_heads, c.head_dim)
        heads_k = k.reshape(num_tokens, c.num_kv_heads, c.head_dim)
        heads_v = v.reshape(num_tokens, c.num_kv_heads, c.head_dim)
        heads_out = attn.reshape(num_tokens, c.num_heads, c.head_dim)
        batched = batch.batched
        if batched is None:
            batched = batched_tokens(batch.token_seq, batch.block_tables.shape[0])
        self.embed(batch.token_ids, hidden)
        activations = (hidden, normed, q, k, v, attn, proj, gate, up, heads_q, heads_k, heads_v, heads_out)
        if not parallel and self.serial_layers is not None:
            self.serial_layers.run(batch, batched, kv_arena, activations)
        else:
            self._layers(batch, batched, kv_arena, activations, parallel)
        rows = batch.logits_rows.shape[0]
        final = self.final_normed[:rows]
        ops.rms_norm(hidden[batch.logits_rows], self.weights.output_norm, c.rms_norm_eps, final)
        logits = self.logits[:rows]
        self.weights.output.apply(self.output_input.prepare(final), logits, parallel)
        return logits

    def _layers(self, batch: ForwardBatch, batched: np.ndarray, kv_arena: np.ndarray, activations: tuple,
                parallel: bool) -> None:
        """The layer loop from Python, one kernel call at a time (SerialLayers runs it as one call)."""
        c = self.config
        hidden, normed, q, k, v, attn, proj, gate, up, heads_q, heads_k, heads_v, heads_out = activations
        for index, layer in enumerate(self.weights.layers):
            ops.rms_norm(hidden, layer.attn_norm, c.rms_norm_eps, normed)
            prepared = self.normed_input.prepare(normed)
            self.qkv[index].apply(prepared, (q, k, v), parallel)
            if layer.q_bias is not None:
                ops.add_bias(q, layer.q_bias)
                ops.add_bias(k, layer.k_bias)
                ops.add_bias(v, layer.v_bias)
            ops.apply_rope(heads_q, batch.positions, self.rope_cos, self.rope_sin, c.rope_neox)
            ops.apply_rope(heads_k, batch.positions, self.rope_cos, self.rope_sin, c.rope_neox)
            k_cache, v_cache = kv_arena[index, 0], kv_arena[index, 1]
            write_kv(heads_k, heads_v, batch.slot_mapping, k_cache, v_cache, self.kv_row, self.kv_half_bits)
            paged_attention(heads_q, k_cache, v_cache, batch.block_tables, batch.token_seq, batch.token_context,
                            batched, self.attention_scale, heads_out, self.attention_work, None if parallel else False)
            layer.o.apply(self.attn_input.prepare(attn), proj, parallel)
            ops.add_in_place(hidden, proj)
            ops.rms_norm(hidden, layer.ffn_norm, c.rms_norm_eps, normed)
            prepared = self.normed_input.prepare(normed)
            self.gate_up[index].apply(prepared, (gate, up), parallel)
            ops.silu_mul(gate, up, gate)
            layer.down.apply(self.ffn_input.prepare(gate), proj, parallel)
            ops.add_in_place(hidden, proj)
