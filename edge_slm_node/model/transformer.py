"""The decoder forward pass over a batch of tokens from one or more sequences (paged KV).

forward() = embedding -> kernels/layers.decoder_layers (every layer, one GIL-free call) ->
final norm -> output head. The arguments of the layer kernel are gathered here once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..kernels import ops
from ..kernels.attention import attention_work, check_work
from ..kernels.gelu import gelu_table
from ..kernels.layers import (Activations, BatchArrays, LayerArrays, LayerConsts, Team, decoder_layers, layer_list,
                              matmul_table)
from ..kernels.quants import Q8_0
from ..kernels.quants.common import new_scratch, set_team
from ..kernels.quants.q8_0 import gather_rows
from ..kernels.team import barrier, new_sync
from .buffers import GuardZones
from .config import ModelConfig
from .linear import FusedLinear
from .weights import ModelWeights

_EMPTY_F32 = np.zeros(0, np.float32)
_NO_SYNC = new_sync()                 # a team of one never touches it
# A team member waiting this long at a barrier gives the forward up (its partner died): far
# beyond any step's work. Counted in cycles of the CPU's counter (rdtsc, a few GHz on x86; a
# coarse deadline, only for a thread that never comes).
TEAM_PATIENCE_S = 2.0
CYCLES_PER_SECOND = 3e9


@dataclass
class ForwardBatch:
    """Which tokens to run and where their KV lives; all arrays int32.

    token_ids, positions, token_seq (row into block_tables), token_context (positions the token
    attends to, itself included), slot_mapping (arena slot its KV is written to): shape (T,).
    block_tables (S, max_blocks). logits_rows: indices into T whose logits are wanted.
    call_index, call_length (T,) optional: the token's index in, and the length of, the llama.cpp
    call (a prompt's micro-batch; 1 for a decoded token) that would compute it when its sequence
    runs alone. Attention (kernels/attention.py) and the K-quant matmuls (kernels/quants/common.py)
    sum each token in that call's order, so its result does not depend on the rest of the batch.
    By default a sequence's tokens in this batch are one call (default_calls).
    """
    token_ids: np.ndarray
    positions: np.ndarray
    token_seq: np.ndarray
    token_context: np.ndarray
    slot_mapping: np.ndarray
    block_tables: np.ndarray
    logits_rows: np.ndarray
    call_index: Optional[np.ndarray] = None
    call_length: Optional[np.ndarray] = None


def default_calls(token_seq: np.ndarray, num_sequences: int) -> tuple:
    """-> (call_index, call_length) (T,) int32 when each sequence's tokens in the batch (in batch
    order) are one call."""
    counts = np.bincount(token_seq, minlength=num_sequences)
    seen = np.zeros(num_sequences, np.int32)
    index = np.zeros(token_seq.shape[0], np.int32)
    for t, seq in enumerate(token_seq):
        index[t] = seen[seq]
        seen[seq] += 1
    return index, counts[token_seq].astype(np.int32)


class TeamAborted(RuntimeError):
    """A member of a forward's team never reached a barrier (its thread died or never started)."""


@dataclass
class TeamRole:
    """One thread's part in a team forward (kernels/team.py): member index, team size, the lead
    Transformer whose activations and logits the team shares, the sync array (zeroed by the lead
    before the members start) and how long a member waits for the others before giving up."""
    member: int
    members: int
    lead: "Transformer"
    sync: np.ndarray
    patience_s: float = TEAM_PATIENCE_S

    @classmethod
    def alone(cls, transformer: "Transformer") -> "TeamRole":
        return cls(0, 1, transformer, _NO_SYNC)

    def kernel_team(self) -> Team:
        return Team(np.int64(self.member), np.int64(self.members), self.sync,
                    np.int64(self.patience_s * CYCLES_PER_SECOND))

    def meet(self, number: int) -> bool:
        return barrier(self.sync, self.members, number, np.int64(self.patience_s * CYCLES_PER_SECOND))


class Transformer:
    """Runs ModelWeights; owns every activation buffer (allocated once for max_batch_tokens)."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, max_batch_tokens: int,
                 max_context: int, max_logits_rows: int, avx512: bool = False,
                 guards: Optional[GuardZones] = None):
        """avx512: attention and SwiGLU round as llama.cpp's AVX-512 build does (its native build
        on a CPU with AVX-512), else as its AVX2 build; the matmuls are the same in both.
        guards: allocates the buffers (with guard zones when enabled)."""
        guards = guards or GuardZones(False)
        self.config = config
        self.weights = weights
        self.max_batch_tokens = max_batch_tokens
        self.max_context = max_context
        c, t = config, max_batch_tokens
        activation_widths = (c.hidden_size, c.hidden_size, c.q_size, c.kv_size, c.kv_size, c.q_size, c.hidden_size,
                             c.intermediate_size, c.intermediate_size)
        self.buffers = Activations(*[guards.zeros(f"activations.{name}", (t, width), np.float32)
                                     for name, width in zip(Activations._fields, activation_widths)],
                                   empty=np.zeros((0, 0), np.float32))
        self.logits = guards.zeros("logits", (max_logits_rows, c.vocab_size), np.float32)
        # each token's llama.cpp call (ForwardBatch), shared by the three matmul inputs' scratch
        self.calls = (guards.zeros("call_index", t, np.int32), guards.zeros("call_length", t, np.int32))
        self.prompt_order = guards.zeros("prompt_order", t, np.uint8)
        self.final_normed = guards.zeros("final_normed", (max_logits_rows, c.hidden_size), np.float32)
        # q|k|v and gate|up each run as one kernel call over concatenated packed rows where
        # their types allow (one pass over the shared input instead of three / two); same results.
        self.qkv = [FusedLinear([l.q, l.k, l.v]) for l in weights.layers]
        self.gate_up = [FusedLinear([l.gate, l.up]) for l in weights.layers]
        # one RoPE table per base: gemma3's sliding-window layers have their own
        self.rope_tables = {base: ops.rope_tables(max_context, c.rotary_dims, base, weights.rope_freqs)
                            for base in {self._rope_base(i) for i in range(c.num_layers)}}
        self.layer_arrays = tuple(_layer_arrays(layer, qkv, gate_up, self.rope_tables[self._rope_base(i)],
                                                c.layer_window(i))
                                  for i, (layer, qkv, gate_up) in enumerate(zip(weights.layers, self.qkv,
                                                                                self.gate_up)))
        types = sorted({m.quant.name: m.quant for layer in weights.layers for m in _matrices(layer)}.items())
        index = {name: i for i, (name, _) in enumerate(types)}
        self.kernel_of = np.array([index[m.quant.name] for layer in weights.layers for m in _matrices(layer)], np.int32)
        self.layer_list = layer_list(self.layer_arrays)
        self.matmuls = {threads: matmul_table([(q.kernels.matmul_parallel if threads else q.kernels.matmul_serial)
                                               for _, q in types]) for threads in (False, True)}
        readers = {"hidden": [m for l in weights.layers for m in (l.q, l.k, l.v, l.gate, l.up)],
                   "q": [l.o for l in weights.layers], "ffn": [l.down for l in weights.layers]}
        widths = {"hidden": c.hidden_size, "q": c.q_size, "ffn": c.intermediate_size}

        def allocator(owner):
            return lambda slot, size, dtype: guards.zeros(f"{owner} scratch.{slot}", size, dtype)
        self.inputs = tuple(new_scratch(t, widths[k], {s for m in readers[k] for s in m.scratch_slots}, allocator(k),
                                        calls=self.calls)
                            for k in ("hidden", "q", "ffn"))
        self.head_input = new_scratch(max_logits_rows, c.hidden_size, set(weights.output.scratch_slots),
                                      allocator("head"))
        self.attention_work = attention_work(c.num_heads, c.num_kv_heads, c.head_dim, max_context,
                                             lambda shape, dtype: guards.zeros("attention work", shape, dtype))
        attention_scale = np.float32(c.attention_scale) if c.attention_scale else \
            np.float32(1.0) / np.sqrt(np.float32(c.head_dim))          # 1.0f/sqrtf(d) as llama.cpp
        self.consts = LayerConsts(
            np.float32(c.rms_norm_eps), c.rope_neox, c.num_heads, c.num_kv_heads, c.head_dim, attention_scale,
            self.attention_work, np.zeros(c.head_dim, np.float32), np.zeros(8, np.uint16), bool(avx512),
            np.float32(c.query_scale), gelu_table() if c.activation == "gelu" else _EMPTY_F32)
        self.embedding_scale = np.float32(c.embedding_scale)
        # A tied Q8_0 embedding is read from the output head's packed rows: the repack released
        # the file pages of the GGUF copy, and each new token id would page-fault on them.
        self.embedding_from_head = weights.embedding_quant is Q8_0 and weights.output.raw is weights.embedding_raw
        # Otherwise the type's GGUF-layout row lookup (Q8_0, Q5_0, Q5_1, the K-quants), else NumPy, on
        # rows read from the file into a staging buffer (gguf_file.TensorRowReader: no page faults).
        self.embed_rows = getattr(weights.embedding_quant.kernels, "embed_rows", None)
        self.embedding_staging = guards.zeros("embedding rows", (0 if self.embedding_from_head else t,
                                                                 weights.embedding_raw.shape[1]), np.uint8)
        self.staged_rows = np.arange(t, dtype=np.int32)

    def _rope_base(self, layer: int) -> float:
        c = self.config
        return c.rope_freq_base_swa if c.layer_window(layer) else c.rope_freq_base

    def resident_arrays(self) -> list:
        """Every array a forward pass reads or writes: weights and buffers (to lock them in RAM)."""
        w = self.weights
        arrays = [w.output_norm, *w.output.kernel_arrays()]
        if not self.embedding_from_head:
            arrays.append(w.embedding_raw)
        for layer in self.layer_arrays:
            arrays += [layer.attn_norm, layer.ffn_norm, layer.q_bias, layer.k_bias, layer.v_bias, *layer.packed,
                       *layer.tails, *layer.part_ends, layer.q_norm, layer.k_norm, layer.post_attn_norm,
                       layer.post_ffn_norm]
        c = self.consts
        arrays += [*self.buffers, self.embedding_staging, self.logits, self.final_normed, c.attention_work, c.kv_row,
                   c.kv_bits, c.gelu_table, *self.calls, self.prompt_order]
        arrays += [table for pair in self.rope_tables.values() for table in pair]
        for scratch in (*self.inputs, self.head_input):
            arrays += list(scratch)
        return [a for a in arrays if a is not None and a.size]

    def embed(self, token_ids: np.ndarray, out: np.ndarray) -> None:
        w = self.weights
        if self.embedding_from_head:
            gather_rows(w.output.packed, w.output.tail, token_ids, out)
        else:
            rows = self.embedding_staging[:token_ids.shape[0]]
            if w.embedding_rows is not None:
                w.embedding_rows.read(token_ids, rows)
            else:
                rows[:] = w.embedding_raw[token_ids]
            if self.embed_rows is not None:
                self.embed_rows(rows, self.staged_rows[:token_ids.shape[0]], out)
            else:
                out[:] = w.embedding_quant.dequantize(rows)
        if self.embedding_scale != 1.0:                 # gemma3: ggml_scale by sqrtf(hidden)
            ops.scale_in_place(out, self.embedding_scale)

    def forward(self, batch: ForwardBatch, kv_arena: np.ndarray, parallel: bool = True,
                team: Optional[TeamRole] = None) -> np.ndarray:
        """Run the tokens, write their KV into kv_arena (layers, 2, blocks, block_size, kv_heads,
        head_dim) u16 (KVArena.data), return logits (len(logits_rows), vocab) — a view of an internal buffer.
        parallel=False: every kernel on the calling thread (side threads run forwards side by side).
        team: this thread is one member of a team running this one forward together (kernels on
        their calling threads): every member calls forward with the same batch and the lead's
        (member 0's) Transformer as team.lead; all return the lead's logits, complete."""
        c = self.config
        num_tokens = batch.token_ids.shape[0]
        if num_tokens > self.max_batch_tokens:
            raise ValueError(f"batch has {num_tokens} tokens, engine buffers hold {self.max_batch_tokens}")
        context = int(batch.token_context.max()) if num_tokens else 0
        if context > self.max_context:                  # the kernels trust their arguments: check them here
            raise ValueError(f"attention context {context} > max_context {self.max_context}")
        check_work(self.attention_work, c.num_heads, c.num_kv_heads, c.head_dim, context)
        call_index, call_length = batch.call_index, batch.call_length
        if call_index is None:
            call_index, call_length = default_calls(batch.token_seq, batch.block_tables.shape[0])
        self.calls[0][:num_tokens] = call_index
        self.calls[1][:num_tokens] = call_length
        prompt_order = self.prompt_order[:num_tokens]          # llama.cpp's multi-token attention order
        np.greater_equal(call_length, 2, out=prompt_order, casting="unsafe")
        team = team or TeamRole.alone(self)
        for scratch in (*self.inputs, self.head_input):
            set_team(scratch, team.member, team.members)
        shared = team.lead
        acts = Activations(*[b[:num_tokens] for b in shared.buffers[:-1]], empty=shared.buffers.empty)
        if team.member == 0:
            self.embed(batch.token_ids, acts.hidden)
        passed = decoder_layers(self.layer_list, self.matmuls[parallel], self.kernel_of, acts, self.inputs,
                                BatchArrays(batch.positions, batch.slot_mapping, batch.block_tables, batch.token_seq,
                                            batch.token_context, prompt_order, batch.logits_rows),
                                self.consts, kv_arena, parallel, team.kernel_team())
        rows = batch.logits_rows.shape[0]
        final = self.final_normed[:rows]
        # fewer rows than tokens: the last layer finished only those, into hidden[:rows] (kernels/layers.py)
        selected = acts.hidden[:rows] if rows < num_tokens else acts.hidden[batch.logits_rows]
        ops.rms_norm(selected, self.weights.output_norm, c.rms_norm_eps, final)     # each member, the same
        logits = shared.logits[:rows]
        self.weights.output.apply(final, self.head_input, logits, parallel, rows_alone=True)
        if passed < 0 or not team.meet(passed + 1):          # every member's share of the head is in
            raise TeamAborted(f"a forward's team of {team.members} was given up: a member did not reach its "
                              f"barrier within {team.patience_s:g} s")
        if c.final_logit_softcapping and team.member == 0:
            cap = np.float32(c.final_logit_softcapping)
            np.multiply(np.tanh(logits * (np.float32(1.0) / cap)), cap, out=logits)
        return logits


def _matrices(layer) -> tuple:
    return (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down)


def _layer_arrays(layer, qkv: FusedLinear, gate_up: FusedLinear, rope: tuple, window: int) -> LayerArrays:
    """One layer's arrays in the layer kernel's order (kernels/layers.py); a fused group's
    first matrix holds the concatenation, the others are left empty."""
    matrices = list(_matrices(layer))
    packed = [m.packed for m in matrices]
    tails = [m.tail for m in matrices]
    ends = [m.part_ends for m in matrices]
    for first, group in ((0, qkv), (4, gate_up)):
        if group.fused:
            packed[first], tails[first], ends[first] = group.packed, group.tail, group.part_ends
            for other in range(first + 1, first + len(group.parts)):
                packed[other] = np.zeros((0, 0), np.uint8)
                tails[other] = np.zeros((0, 0), np.uint8)
                ends[other] = np.zeros(1, np.int64)
    bias = lambda b: _EMPTY_F32 if b is None else np.ascontiguousarray(b)
    return LayerArrays(np.ascontiguousarray(layer.attn_norm), np.ascontiguousarray(layer.ffn_norm),
                       bias(layer.q_bias), bias(layer.k_bias), bias(layer.v_bias), tuple(packed), tuple(tails),
                       tuple(ends), qkv.fused, gate_up.fused, bias(layer.q_norm), bias(layer.k_norm),
                       bias(layer.post_attn_norm), bias(layer.post_ffn_norm), rope[0], rope[1], np.int64(window))
