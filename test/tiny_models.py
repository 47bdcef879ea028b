"""Write small random GGUF models (llama / qwen2 / qwen3 / gemma3 layouts, chosen quant types) for tests,
(quantized by gguf-py), and a plain NumPy reference forward that reads the same file through
each type's NumPy dequantizer.

qwen3 and gemma3 files get their own head_dim (key_length, not hidden / heads) and per-head
q/k norms; gemma3 files also a sliding window of
GEMMA3_WINDOW positions on every layer but each GEMMA3_PATTERN-th and the post-attention /
post-FFN norms."""
from __future__ import annotations

import numpy as np
from gguf import GGUFWriter, TokenType
from gguf.quants import quantize

from edge_slm_node.kernels import quants as q
from edge_slm_node.model.gguf_file import GGUFFile
from edge_slm_node.model.tokenizer import byte_level_alphabet

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


GEMMA3_WINDOW = 20
GEMMA3_PATTERN = 3


def write_tiny_model(path, arch="llama", weight_quant=q.Q4_1, embedding_quant=q.Q8_0, hidden=64,
                     layers=2, heads=4, kv_heads=2, intermediate=96, tied=True, seed=0, context=512, head_dim=None,
                     extra_metadata=None, rope_freqs=False):
    """extra_metadata: more keys (str, bool, int -> uint32, float -> float32) written after the usual ones;
    rope_freqs: a rope_freqs.weight tensor (Llama 3.x frequency factors, 1 .. 8 over the pairs)."""
    rng = np.random.default_rng(seed)
    alphabet = sorted(byte_level_alphabet(), key=byte_level_alphabet().get)
    tokens = SPECIAL_TOKENS + alphabet + ["Ġt", "he", "Ġthe"]
    types = [TokenType.CONTROL] * len(SPECIAL_TOKENS) + [TokenType.NORMAL] * (len(tokens) - len(SPECIAL_TOKENS))
    vocab = len(tokens)
    head_dim = head_dim or (2 * hidden // heads if arch in ("qwen3", "gemma3") else hidden // heads)
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(layers)
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(1e6 if arch == "gemma3" else 10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    if arch in ("qwen3", "gemma3"):
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if arch == "gemma3":
        writer.add_sliding_window(GEMMA3_WINDOW)
        writer.add_uint32("gemma3.attention.sliding_window_pattern", GEMMA3_PATTERN)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(["Ġ t", "h e", "Ġt he"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)
    for key, value in (extra_metadata or {}).items():
        add = {str: writer.add_string, bool: writer.add_bool, int: writer.add_uint32, float: writer.add_float32}
        add[type(value)](key, value)

    def tensor(name, rows, cols, quant, scale=0.1):
        weights = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        if quant is q.F32:
            writer.add_tensor(name, weights)
        elif quant is q.F16:
            writer.add_tensor(name, weights.astype(np.float16))
        else:
            writer.add_tensor(name, quantize(weights, quant.ggml_type), raw_dtype=quant.ggml_type)

    def vector(name, length, center=1.0):
        writer.add_tensor(name, (center + 0.1 * rng.standard_normal(length)).astype(np.float32))

    tensor("token_embd.weight", vocab, hidden, embedding_quant, scale=1.0)
    if rope_freqs:
        writer.add_tensor("rope_freqs.weight", np.linspace(1.0, 8.0, head_dim // 2).astype(np.float32))
    for i in range(layers):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", hidden)
        tensor(p + "attn_q.weight", heads * head_dim, hidden, weight_quant)
        tensor(p + "attn_k.weight", kv_heads * head_dim, hidden, weight_quant)
        tensor(p + "attn_v.weight", kv_heads * head_dim, hidden, weight_quant)
        if arch == "qwen2":
            vector(p + "attn_q.bias", heads * head_dim, 0.0)
            vector(p + "attn_k.bias", kv_heads * head_dim, 0.0)
            vector(p + "attn_v.bias", kv_heads * head_dim, 0.0)
        tensor(p + "attn_output.weight", hidden, heads * head_dim, weight_quant)
        vector(p + "ffn_norm.weight", hidden)
        if arch in ("qwen3", "gemma3"):
            vector(p + "attn_q_norm.weight", head_dim)
            vector(p + "attn_k_norm.weight", head_dim)
        if arch == "gemma3":
            vector(p + "post_attention_norm.weight", hidden)
            vector(p + "post_ffw_norm.weight", hidden)
        tensor(p + "ffn_gate.weight", intermediate, hidden, weight_quant)
        tensor(p + "ffn_up.weight", intermediate, hidden, weight_quant)
        tensor(p + "ffn_down.weight", hidden, intermediate, weight_quant)
    vector("output_norm.weight", hidden)
    if not tied:
        tensor("output.weight", vocab, hidden, weight_quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def reference_logits(path, token_ids, window=None):
    """Float64 NumPy forward over the whole sequence (no cache); -> logits (T, vocab).
    window: gemma3's sliding window (None = the file's; 0 = none, to show it matters)."""
    g = GGUFFile(str(path))
    arch = g.metadata["general.architecture"]
    meta = lambda key: g.metadata[f"{arch}.{key}"]
    heads, kv_heads, hidden = meta("attention.head_count"), meta("attention.head_count_kv"), meta("embedding_length")
    head_dim, eps = g.metadata.get(f"{arch}.attention.key_length", hidden // heads), meta("attention.layer_norm_rms_epsilon")
    gemma = arch == "gemma3"
    neox = arch in ("qwen2", "qwen3", "gemma3")

    def w(name):
        info = g.tensors[name]
        values = info.quant.dequantize(g.tensor_bytes(name)).astype(np.float64)
        return values.reshape(-1) if len(info.shape) == 1 else values

    def norm(x, weight):
        return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * weight

    def rope(x, base):                                   # x (T, heads, head_dim)
        positions = np.arange(x.shape[0])[:, None]
        theta = positions * base ** (-2.0 * np.arange(head_dim // 2) / head_dim) / factors
        cos, sin = np.cos(theta)[:, None], np.sin(theta)[:, None]
        a, b = (slice(0, head_dim // 2), slice(head_dim // 2, None)) if neox else (slice(0, None, 2), slice(1, None, 2))
        out = x.copy()
        out[..., a] = x[..., a] * cos - x[..., b] * sin
        out[..., b] = x[..., a] * sin + x[..., b] * cos
        return out

    factors = w("rope_freqs.weight") if "rope_freqs.weight" in g.tensors else 1.0
    T = len(token_ids)
    x = w("token_embd.weight")[token_ids]
    if gemma:
        x = x * np.sqrt(hidden)
    causal = np.triu(np.full((T, T), -np.inf), 1)
    distance = np.arange(T)[:, None] - np.arange(T)[None, :]
    for i in range(meta("block_count")):
        p = f"blk.{i}."
        local = gemma and i % g.metadata["gemma3.attention.sliding_window_pattern"] < \
            g.metadata["gemma3.attention.sliding_window_pattern"] - 1
        size = (g.metadata["gemma3.attention.sliding_window"] if window is None else window) if local else 0
        mask = np.where(distance >= size, -np.inf, causal) if size else causal
        base = 10000.0 if local else meta("rope.freq_base")
        h = norm(x, w(p + "attn_norm.weight"))
        qv, kv, vv = h @ w(p + "attn_q.weight").T, h @ w(p + "attn_k.weight").T, h @ w(p + "attn_v.weight").T
        if arch == "qwen2":
            qv, kv, vv = qv + w(p + "attn_q.bias"), kv + w(p + "attn_k.bias"), vv + w(p + "attn_v.bias")
        qh, kh = qv.reshape(T, heads, head_dim), kv.reshape(T, kv_heads, head_dim)
        if arch in ("qwen3", "gemma3"):
            qh, kh = norm(qh, w(p + "attn_q_norm.weight")), norm(kh, w(p + "attn_k_norm.weight"))
        qh, kh = rope(qh, base), rope(kh, base)
        vh = vv.reshape(T, kv_heads, head_dim)
        group = heads // kv_heads
        out = np.zeros((T, heads, head_dim))
        for hd in range(heads):
            s = qh[:, hd] @ kh[:, hd // group].T / np.sqrt(head_dim) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, hd] = (s / s.sum(-1, keepdims=True)) @ vh[:, hd // group]
        attention = out.reshape(T, -1) @ w(p + "attn_output.weight").T
        x = x + (norm(attention, w(p + "post_attention_norm.weight")) if gemma else attention)
        h = norm(x, w(p + "ffn_norm.weight"))
        gate, up = h @ w(p + "ffn_gate.weight").T, h @ w(p + "ffn_up.weight").T
        if gemma:
            gelu = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3)))
            x = x + norm((gelu * up) @ w(p + "ffn_down.weight").T, w(p + "post_ffw_norm.weight"))
        else:
            x = x + (gate / (1 + np.exp(-gate)) * up) @ w(p + "ffn_down.weight").T
    output = w("output.weight") if "output.weight" in g.tensors else w("token_embd.weight")
    return norm(x, w("output_norm.weight")) @ output.T
