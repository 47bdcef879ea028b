"""The decoder layer, written once: every layer of a batch in one GIL-free call.

Prompt steps and decode steps run this same code; they differ in the matmul kernels they
pass (each weight type's matmul_parallel or matmul_serial, as function objects with the
common signature of kernels/quants/common.py), in `threads` (paged attention on numba's
thread pool when big enough, else on the calling thread) and in `team` (Team: the threads
running this one forward together; a team of one runs everything). Arguments come grouped, as
namedtuples built once by model/transformer.py:

  layers   typed List (layer_list), per layer LayerArrays: norms (n,), biases (rows,) or empty, the packed bytes,
           tail rows and part ends of its 7 matrices q, k, v, o, gate, up, down (when q|k|v
           or gate|up are fused, q / gate hold the fused matrix and k, v / up are empty);
           per-head q/k norms (head_dim,; qwen3, gemma3) and post-attention / post-FFN norms (n,; gemma3), or
           empty; the layer's RoPE tables (positions, rotary_dims/2) and its attention window
           (0 = every position)
  matmuls  typed List of the distinct matmul kernels (matmul_table), and kernel_of (layers * 7,)
           int32: matmuls[kernel_of[7 * layer + m]] runs matrix m of that layer. (A tuple of
           function objects would be unboxed from Python on every call: ~0.2 ms each.)
  acts     Activations: (T, ·) C-contiguous views for this batch's T tokens
  inputs   Scratch for the three matmul input widths: hidden, q_size, intermediate, their call
           shapes (call_index, call_length: each token's llama.cpp call) set by the caller
  batch    BatchArrays: positions, slot_mapping (T,), block_tables (S, blocks), token_seq,
           token_context, prompt_order (T,), output_rows (R,): the rows whose logits are wanted.
           When R < T the last layer's feed-forward runs on those rows only, as llama.cpp's
           graph does (inp_out_ids): they end up in hidden[:R], in that order, and the other
           rows of hidden are left unfinished. Those rows' feed-forward is summed as llama.cpp
           sums a call of one row (each scratch's call shapes set so; kernels/quants/common.py).
  consts   LayerConsts: eps, neox, attention scale and work, KV-write scratch, avx512
           (attention and SwiGLU in the summation orders and exp of llama.cpp's AVX-512 build,
           else of its AVX2 build; the matmuls are the same in both), query_scale (q times it
           after RoPE, gemma3; 1 = none), gelu_table (GeGLU instead of SwiGLU when non-empty)
"""
import warnings
from collections import namedtuple

from numba import njit, types
from numba.core.errors import NumbaExperimentalFeatureWarning
from numba.typed import List

from .attention import PARALLEL_MIN_MACS, paged_attention_parallel, paged_attention_serial
from .gelu import geglu
from .kv_write import write_kv
from .ops import add_bias, add_in_place, apply_rope, rms_norm, scale_in_place, silu_mul
from .quants.common import MATMUL_SIGNATURE
from .team import barrier, member_share

# The matmuls are called through numba's first-class function objects, the one experimental
# numba feature used here; the tests cover it (bit-equality with the scalar references).
warnings.filterwarnings("ignore", message="First-class function type feature is experimental",
                        category=NumbaExperimentalFeatureWarning)

Q, K, V, O, GATE, UP, DOWN = range(7)
MATRICES = 7
MATMUL_TYPE = types.FunctionType(MATMUL_SIGNATURE)


def matmul_table(kernels) -> List:
    """The kernels (each weight type's matmul_serial or matmul_parallel) as the typed list
    decoder_layers takes: passed from Python in O(1). Built by a cached numba function: the
    typed list's own methods would otherwise compile at every start (~2 s)."""
    return _table_of(tuple(kernels))


def layer_list(layers: tuple) -> List:
    """The layers' LayerArrays as a typed list: a tuple of them (~30 x 26 arrays) would be
    unboxed from Python on every call (~0.2 ms), the list is passed in O(1)."""
    return _list_of(layers)


@njit(cache=True)
def _list_of(items):
    out = List()
    for i in range(len(items)):
        out.append(items[i])
    return out


@njit(cache=True)
def _table_of(kernels):
    table = List.empty_list(MATMUL_TYPE)
    for i in range(len(kernels)):
        table.append(kernels[i])
    return table

LayerArrays = namedtuple("LayerArrays", ["attn_norm", "ffn_norm", "q_bias", "k_bias", "v_bias", "packed", "tails",
                                         "part_ends", "qkv_fused", "gate_up_fused", "q_norm", "k_norm",
                                         "post_attn_norm", "post_ffn_norm", "rope_cos", "rope_sin", "window"])
Activations = namedtuple("Activations", ["hidden", "normed", "q", "k", "v", "attn", "proj", "gate", "up", "empty"])
BatchArrays = namedtuple("BatchArrays", ["positions", "slot_mapping", "block_tables", "token_seq", "token_context",
                                         "prompt_order", "output_rows"])
# A forward's team (kernels/team.py): this thread's member index, how many run it, their shared
# sync array (zeroed before the forward) and how many CPU cycles a member waits at a barrier
# before it gives the team up
Team = namedtuple("Team", ["member", "members", "sync", "patience"])
LayerConsts = namedtuple("LayerConsts", ["eps", "neox", "num_heads", "num_kv_heads", "head_dim", "attention_scale",
                                         "attention_work", "kv_row", "kv_bits", "avx512", "query_scale",
                                         "gelu_table"])


@njit(cache=True, inline="always")
def _gather_rows(x, rows, scratch):
    """x[:len(rows)] = x[rows] (any order, repeats allowed), through scratch (>= len(rows) rows)."""
    for i in range(rows.shape[0]):
        scratch[i, :] = x[rows[i]]
    for i in range(rows.shape[0]):
        x[i, :] = scratch[i]


@njit(cache=True, inline="always")
def _each_row_alone(scratch, rows):
    """The next matmul on this input sums rows 0..rows-1 each as a call of one token."""
    for t in range(rows):
        scratch.call_index[t] = 0
        scratch.call_length[t] = 1


@njit(cache=True, inline="always")
def _matmul(layer, matmuls, kernel_of, index, m, x, scratch, outs):
    matmuls[kernel_of[MATRICES * index + m]](layer.packed[m], layer.tails[m], layer.part_ends[m], x, scratch, outs)


@njit(cache=True, inline="always")
def _parts(layer, matmuls, kernel_of, index, first, count, fused, x, scratch, a, b, c, empty):
    """Matrices first.. first+count-1 (count 2 or 3) on x: one fused call, or one call each."""
    if fused:
        _matmul(layer, matmuls, kernel_of, index, first, x, scratch, (a, b, c))
    else:
        _matmul(layer, matmuls, kernel_of, index, first, x, scratch, (a, empty, empty))
        _matmul(layer, matmuls, kernel_of, index, first + 1, x, scratch, (b, empty, empty))
        if count == 3:
            _matmul(layer, matmuls, kernel_of, index, first + 2, x, scratch, (c, empty, empty))


@njit(cache=True, inline="always")
def _meet(team, passed):
    """The team's next barrier after `passed` ones; -> how many are passed now, -1 if the team is aborted."""
    if passed < 0 or not barrier(team.sync, team.members, passed + 1, team.patience):
        return -1
    return passed + 1


@njit(cache=True, nogil=True)
def decoder_layers(layers, matmuls, kernel_of, acts, inputs, batch, consts, kv_arena, threads, team):
    """acts.hidden (T, n) through every layer in place; each layer's K and V written into
    kv_arena (layers, 2, blocks, block_size, kv_heads, head_dim) u16 at batch.slot_mapping.
    Run by each member of `team` (Team) on the same acts (the lead's embedding in
    acts.hidden): the members split each matmul's rows (their `inputs` scratch says which share,
    kernels/quants/common.py), the token rows of the norms, RoPE, KV writes and residual adds,
    and the columns of SwiGLU / GeGLU, and meet at a barrier between steps that read each
    other's results; a team of one runs it all. -> barriers passed (the members' next one is
    that + 1), -1 if the team was aborted."""
    c = consts
    lead = team.member == 0
    num_tokens = acts.hidden.shape[0]
    mine, end = member_share(team.member, team.members, num_tokens, 1)     # this member's token rows
    # vector groups of SwiGLU never straddle two members (its last n % 16 go as its scalar tail)
    first_column, last_column = member_share(team.member, team.members, acts.gate.shape[1], 16)
    passed = _meet(team, 0)                            # the lead's embedding is in
    heads_q = acts.q.reshape(num_tokens, c.num_heads, c.head_dim)
    heads_k = acts.k.reshape(num_tokens, c.num_kv_heads, c.head_dim)
    heads_v = acts.v.reshape(num_tokens, c.num_kv_heads, c.head_dim)
    heads_out = acts.attn.reshape(num_tokens, c.num_heads, c.head_dim)
    context = 0
    for t in range(num_tokens):
        context = max(context, batch.token_context[t])
    attention_on_pool = threads and num_tokens * c.num_heads * c.head_dim * 2 * context >= PARALLEL_MIN_MACS
    model_input, attn_input, ffn_input = inputs
    empty = acts.empty
    for index in range(len(layers)):
        layer = layers[index]
        rms_norm(acts.hidden[mine:end], layer.attn_norm, c.eps, acts.normed[mine:end])
        passed = _meet(team, passed)
        _parts(layer, matmuls, kernel_of, index, Q, 3, layer.qkv_fused, acts.normed, model_input, acts.q, acts.k, acts.v, empty)
        passed = _meet(team, passed)
        _before_attention(layer, index, acts, heads_q, heads_k, heads_v, mine, end, batch, c, kv_arena)
        passed = _meet(team, passed)
        _attention(index, heads_q, heads_out, batch, c, kv_arena, attention_on_pool, layer.window, team)
        passed = _meet(team, passed)
        _matmul(layer, matmuls, kernel_of, index, O, acts.attn, attn_input, (acts.proj, empty, empty))
        passed = _meet(team, passed)
        rows = num_tokens
        if index == len(layers) - 1:
            rows = min(num_tokens, batch.output_rows.shape[0])
            _each_row_alone(model_input, rows)
            _each_row_alone(ffn_input, rows)
        hidden, normed, gate, up, proj = acts.hidden[:rows], acts.normed[:rows], acts.gate[:rows], acts.up[:rows], \
            acts.proj[:rows]
        if rows < num_tokens:                   # the rows kept are gathered first: by the lead alone
            if lead:
                _attention_residual(layer, acts.proj, acts.hidden, c.eps)
                _gather_rows(acts.hidden, batch.output_rows, acts.proj)
                rms_norm(hidden, layer.ffn_norm, c.eps, normed)
            mine, end = member_share(team.member, team.members, rows, 1)
        else:
            _attention_residual(layer, proj[mine:end], hidden[mine:end], c.eps)
            rms_norm(hidden[mine:end], layer.ffn_norm, c.eps, normed[mine:end])
        passed = _meet(team, passed)
        _parts(layer, matmuls, kernel_of, index, GATE, 2, layer.gate_up_fused, normed, model_input, gate, up,
               empty, empty)
        passed = _meet(team, passed)
        if c.gelu_table.shape[0] > 0:
            geglu(gate, up, gate, c.gelu_table, first_column, last_column)
        else:
            silu_mul(gate, up, gate, c.avx512, first_column, last_column)
        passed = _meet(team, passed)
        _matmul(layer, matmuls, kernel_of, index, DOWN, gate, ffn_input, (proj, empty, empty))
        passed = _meet(team, passed)
        if layer.post_ffn_norm.shape[0] > 0:
            rms_norm(proj[mine:end], layer.post_ffn_norm, c.eps, proj[mine:end])
        add_in_place(hidden[mine:end], proj[mine:end])
        if passed < 0:
            return -1
    return _meet(team, passed)            # every member's last residual add is in


@njit(cache=True, inline="always")
def _attention_residual(layer, proj, hidden, eps):
    """hidden += the attention block's output proj (post-attention-normed first, gemma3)."""
    if layer.post_attn_norm.shape[0] > 0:
        rms_norm(proj, layer.post_attn_norm, eps, proj)
    add_in_place(hidden, proj)


@njit(cache=True, inline="always")
def _before_attention(layer, index, acts, heads_q, heads_k, heads_v, first, last, batch, c, kv_arena):
    """q, k, v of tokens first..last-1 of one layer made ready for attention: biases, per-head
    norms, RoPE, the K and V written into the cache."""
    q, k, v = acts.q[first:last], acts.k[first:last], acts.v[first:last]
    heads_q, heads_k, heads_v = heads_q[first:last], heads_k[first:last], heads_v[first:last]
    positions = batch.positions[first:last]
    if layer.q_bias.shape[0] > 0:
        add_bias(q, layer.q_bias)
        add_bias(k, layer.k_bias)
        add_bias(v, layer.v_bias)
    if layer.q_norm.shape[0] > 0:       # per head, in place (each row is read before it is written)
        rows_q = q.reshape((last - first) * c.num_heads, c.head_dim)
        rows_k = k.reshape((last - first) * c.num_kv_heads, c.head_dim)
        rms_norm(rows_q, layer.q_norm, c.eps, rows_q)
        rms_norm(rows_k, layer.k_norm, c.eps, rows_k)
    apply_rope(heads_q, positions, layer.rope_cos, layer.rope_sin, c.neox)
    apply_rope(heads_k, positions, layer.rope_cos, layer.rope_sin, c.neox)
    if c.query_scale != 1.0:
        scale_in_place(q, c.query_scale)
    write_kv(heads_k, heads_v, batch.slot_mapping[first:last], kv_arena[index, 0], kv_arena[index, 1], c.kv_row,
             c.kv_bits)


@njit(cache=True, inline="always")
def _attention(index, heads_q, heads_out, batch, c, kv_arena, on_pool, window, team):
    """Paged attention of one layer into heads_out: on numba's pool, or this team member's share."""
    k_cache, v_cache = kv_arena[index, 0], kv_arena[index, 1]
    if on_pool:
        paged_attention_parallel(heads_q, k_cache, v_cache, batch.block_tables, batch.token_seq,
                                 batch.token_context, batch.prompt_order, c.attention_scale, heads_out,
                                 c.attention_work, c.avx512, window)
    else:
        paged_attention_serial(heads_q, k_cache, v_cache, batch.block_tables, batch.token_seq,
                               batch.token_context, batch.prompt_order, c.attention_scale, heads_out, c.attention_work,
                               c.avx512, window, team.member, team.members)
