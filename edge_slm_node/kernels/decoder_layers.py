"""Every decoder layer of one forward pass in one call, on the calling thread, without the GIL.

Split decode runs two forward passes side by side on two threads. Driven from Python, each
layer is ~15 kernel calls with Python between them, and the two threads took turns on the GIL
~220 times per step (a blocked thread's vCPU halts and costs a wake-up each time): the parts
ran ~20 % slower together than alone. Here the whole layer loop is one nogil call; it runs
the same kernels in the same order as Transformer.forward's Python loop, so results are
bit-identical. Only for weights that are all packed and whose q|k|v and gate|up are fused
(model/serial_layers.py decides and marshals the arguments).
Note: numba's cache does not notice edits to the kernels this calls; clear __pycache__.
"""
from numba import njit

from .attention import paged_attention_serial, write_kv
from .matmul import (block_sums, matmul_q4_0_packed_serial, matmul_q4_1_packed_serial,
                     matmul_q8_0_packed_serial)
from .ops import add_bias, add_in_place, apply_rope, rms_norm, silu_mul
from .quantize import quantize_rows_q8

KIND_Q4_1, KIND_Q4_0, KIND_Q8_0 = 0, 1, 2
QKV, O, GATE_UP, DOWN = 0, 1, 2, 3        # columns of `kinds`


@njit(cache=True)
def _linear(kind, packed, tail, part_ends, x, xq, xd, xs, xq16, sums, half_to_float, outs):
    """x (T, K) f32 -> outs (one (T, rows_p) per part) through packed weights of `kind`."""
    quantize_rows_q8(x, xq, xd, xs)
    if kind == KIND_Q4_1:
        matmul_q4_1_packed_serial(packed, tail, xq, xd, xs, half_to_float, outs, part_ends)
    elif kind == KIND_Q8_0:
        for t in range(xq.shape[0]):
            for i in range(xq.shape[1]):
                xq16[t, i] = xq[t, i]
        matmul_q8_0_packed_serial(packed, tail, xq, xq16, xd, half_to_float, outs, part_ends)
    else:
        block_sums(xq, sums)
        matmul_q4_0_packed_serial(packed, tail, xq, sums, xd, half_to_float, outs, part_ends)


@njit(cache=True, nogil=True)
def decoder_layers_serial(hidden, normed, q, k, v, attn, proj, gate, up, heads_q, heads_k, heads_v, heads_out,
                          model_input, attn_input, ffn_input, weights, kinds, part_ends, norms, biases, eps,
                          positions, rope_cos, rope_sin, neox, kv_arena, slot_mapping, block_tables, token_seq,
                          token_context, batched, scale, work, kv_row, kv_bits, half_to_float):
    """hidden (T, n) f32 through every layer in place (KV written to kv_arena), all on this thread.

    Activations: (T, ·) C-contiguous views, heads_* their (T, heads, head_dim) reshapes.
    *_input: (xq, xd, xs, xq16, sums) quantized-activation buffers for inputs of width hidden,
    q_size and intermediate (xq16 / sums only read for Q8_0 / Q4_0 weights).
    weights: per layer (packed, tail) for q|k|v, o, gate|up, down, as 8 tuples over layers;
    kinds (layers, 4) KIND_*; part_ends: 4 arrays (layers, parts); norms: (attn, ffn) tuples of
    (n,); biases: (q, k, v) tuples, empty arrays where a layer has none."""
    qkv_packed, qkv_tail, o_packed, o_tail, gu_packed, gu_tail, down_packed, down_tail = weights
    qkv_ends, o_ends, gu_ends, down_ends = part_ends
    attn_norms, ffn_norms = norms
    q_bias, k_bias, v_bias = biases
    m_xq, m_xd, m_xs, m_xq16, m_sums = model_input
    a_xq, a_xd, a_xs, a_xq16, a_sums = attn_input
    f_xq, f_xd, f_xs, f_xq16, f_sums = ffn_input
    for layer in range(kinds.shape[0]):
        rms_norm(hidden, attn_norms[layer], eps, normed)
        _linear(kinds[layer, QKV], qkv_packed[layer], qkv_tail[layer], qkv_ends[layer], normed,
                m_xq, m_xd, m_xs, m_xq16, m_sums, half_to_float, (q, k, v))
        if q_bias[layer].shape[0] > 0:
            add_bias(q, q_bias[layer])
            add_bias(k, k_bias[layer])
            add_bias(v, v_bias[layer])
        apply_rope(heads_q, positions, rope_cos, rope_sin, neox)
        apply_rope(heads_k, positions, rope_cos, rope_sin, neox)
        k_cache, v_cache = kv_arena[layer, 0], kv_arena[layer, 1]
        write_kv(heads_k, heads_v, slot_mapping, k_cache, v_cache, kv_row, kv_bits)
        paged_attention_serial(heads_q, k_cache, v_cache, block_tables, token_seq, token_context, batched, scale,
                               heads_out, work)
        _linear(kinds[layer, O], o_packed[layer], o_tail[layer], o_ends[layer], attn,
                a_xq, a_xd, a_xs, a_xq16, a_sums, half_to_float, (proj,))
        add_in_place(hidden, proj)
        rms_norm(hidden, ffn_norms[layer], eps, normed)
        _linear(kinds[layer, GATE_UP], gu_packed[layer], gu_tail[layer], gu_ends[layer], normed,
                m_xq, m_xd, m_xs, m_xq16, m_sums, half_to_float, (gate, up))
        silu_mul(gate, up, gate)
        _linear(kinds[layer, DOWN], down_packed[layer], down_tail[layer], down_ends[layer], gate,
                f_xq, f_xd, f_xs, f_xq16, f_sums, half_to_float, (proj,))
        add_in_place(hidden, proj)
