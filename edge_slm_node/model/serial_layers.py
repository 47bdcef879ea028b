"""A Transformer's layers as the arguments of kernels/decoder_layers.py (gathered once)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

from ..kernels.attention import check_work
from ..kernels.decoder_layers import KIND_Q4_0, KIND_Q4_1, KIND_Q8_0, decoder_layers_serial
from ..kernels.half import HALF_TO_FLOAT
from .linear import FusedLinear, PreparedInput, QuantizedLinear
from .quant import Q4_0, Q4_1, Q8_0

if TYPE_CHECKING:
    from .transformer import ForwardBatch, Transformer

_KINDS = {Q4_1.name: KIND_Q4_1, Q4_0.name: KIND_Q4_0, Q8_0.name: KIND_Q8_0}


class SerialLayers:
    """Runs every layer of `transformer` in one nogil kernel call on the calling thread.

    build() returns None when the weights do not fit that kernel (an unpacked type, or q|k|v or
    gate|up not fusable); Transformer.forward then keeps its Python layer loop."""

    @classmethod
    def build(cls, transformer: "Transformer") -> Optional["SerialLayers"]:
        matrices = [(transformer.qkv[i], layer.o, transformer.gate_up[i], layer.down)
                    for i, layer in enumerate(transformer.weights.layers)]
        if not all(_packed(m) for row in matrices for m in row):
            return None
        inputs = (transformer.normed_input, transformer.attn_input, transformer.ffn_input)
        if not all(p.need_q8 for p in inputs):
            return None
        return cls(transformer, matrices)

    def __init__(self, transformer: "Transformer", matrices: list):
        self.transformer = transformer
        weights = transformer.weights
        self.kinds = np.array([[_KINDS[m.quant.name] for m in row] for row in matrices], np.int8)
        by_matrix = list(zip(*matrices))                       # (qkv per layer, o per layer, ...)
        self.weights = tuple(arrays for column in by_matrix
                             for arrays in (tuple(m.packed for m in column), tuple(m.tail for m in column)))
        self.part_ends = tuple(np.stack([m.part_ends for m in column]) for column in by_matrix)
        self.norms = (tuple(np.ascontiguousarray(l.attn_norm) for l in weights.layers),
                      tuple(np.ascontiguousarray(l.ffn_norm) for l in weights.layers))
        empty = np.zeros(0, np.float32)
        self.biases = tuple(tuple(empty if getattr(l, name) is None else np.ascontiguousarray(getattr(l, name))
                                  for l in weights.layers) for name in ("q_bias", "k_bias", "v_bias"))
        kinds_per_input = (self.kinds[:, [0, 2]], self.kinds[:, 1], self.kinds[:, 3])
        self._inputs = [input_.quantized_buffers(int16=bool((kinds == KIND_Q8_0).any()),
                                                 sums=bool((kinds == KIND_Q4_0).any()))
                        for input_, kinds in zip((transformer.normed_input, transformer.attn_input,
                                                  transformer.ffn_input), kinds_per_input)]

    def own_arrays(self) -> list:
        """Arrays made here (the rest are the transformer's weights and buffers)."""
        return [self.kinds, *self.part_ends]

    def run(self, batch: "ForwardBatch", batched: np.ndarray, kv_arena: np.ndarray, activations: tuple) -> None:
        """activations: (hidden, normed, q, k, v, attn, proj, gate, up, heads_q, heads_k, heads_v,
        heads_out), views for this batch's T tokens; hidden is run through every layer in place."""
        t = self.transformer
        c = t.config
        num_tokens = batch.token_ids.shape[0]
        context = int(batch.token_context.max()) if num_tokens else 0
        if context > t.max_context:                  # the kernel trusts its arguments: check them here
            raise ValueError(f"attention context {context} > max_context {t.max_context}")
        check_work(t.attention_work, c.num_heads, c.num_kv_heads, c.head_dim, context)
        inputs = tuple(tuple(b[:num_tokens] for b in buffers) for buffers in self._inputs)
        decoder_layers_serial(*activations, *inputs, self.weights, self.kinds, self.part_ends, self.norms,
                              self.biases, c.rms_norm_eps, batch.positions, t.rope_cos, t.rope_sin,
                              c.rope_neox, kv_arena, batch.slot_mapping, batch.block_tables, batch.token_seq,
                              batch.token_context, batched, t.attention_scale, t.attention_work, t.kv_row,
                              t.kv_half_bits, HALF_TO_FLOAT)


def _packed(matrix) -> bool:
    if isinstance(matrix, FusedLinear):
        return matrix.fused and matrix.packed.flags.c_contiguous
    assert isinstance(matrix, QuantizedLinear)
    return matrix.packed is not None and matrix.packed.flags.c_contiguous
