"""Bind a GGUF file's tensors to the transformer's weights, checking names and shapes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..kernels.quants import F32, QuantType
from .config import ModelConfig
from .gguf_file import GGUFError, GGUFFile, TensorRowReader
from .linear import Linear
from .load_progress import no_progress


@dataclass
class LayerWeights:
    attn_norm: np.ndarray          # (hidden,) f32
    q: Linear             # (q_size, hidden)
    k: Linear             # (kv_size, hidden)
    v: Linear             # (kv_size, hidden)
    q_bias: Optional[np.ndarray]   # (q_size,) f32, qwen2 only
    k_bias: Optional[np.ndarray]
    v_bias: Optional[np.ndarray]
    o: Linear             # (hidden, q_size)
    ffn_norm: np.ndarray           # (hidden,) f32
    gate: Linear          # (intermediate, hidden)
    up: Linear            # (intermediate, hidden)
    down: Linear          # (hidden, intermediate)
    q_norm: Optional[np.ndarray] = None          # (head_dim,) f32, per-head RMSNorm weights (gemma3)
    k_norm: Optional[np.ndarray] = None
    post_attn_norm: Optional[np.ndarray] = None  # (hidden,) f32, on the attention output (gemma3)
    post_ffn_norm: Optional[np.ndarray] = None   # (hidden,) f32, on the FFN output (gemma3)

    def norms(self) -> list:
        return [n for n in (self.attn_norm, self.ffn_norm, self.q_norm, self.k_norm, self.post_attn_norm,
                            self.post_ffn_norm) if n is not None]


@dataclass
class ModelWeights:
    embedding_raw: np.ndarray      # (vocab, bytes_per_row) as stored
    embedding_quant: QuantType
    output_norm: np.ndarray        # (hidden,) f32
    output: Linear        # (vocab, hidden); token_embd when tied
    layers: list
    rope_freqs: Optional[np.ndarray] = None   # (rotary_dims/2,) f32: Llama 3.x RoPE frequency factors
    embedding_rows: Optional[TensorRowReader] = None   # reads embedding_raw's rows from the file (pread)

    def layer_linears(self) -> list:
        """Every layer's weight matrices (q, k, v, o, gate, up, down of each layer, in order)."""
        return [linear for layer in self.layers
                for linear in (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down)]

    @property
    def num_bytes(self) -> int:
        total = self.embedding_raw.nbytes + self.output_norm.nbytes
        if self.output.raw is not self.embedding_raw:
            total += self.output.raw.nbytes
        total += sum(linear.raw.nbytes for linear in self.layer_linears())
        return total + sum(norm.nbytes for layer in self.layers for norm in layer.norms())


def _tensor(gguf: GGUFFile, name: str, expected_shape: tuple[int, ...]):
    info = gguf.tensors.get(name)
    if info is None:
        raise GGUFError(f"{gguf.path}: tensor {name!r} missing")
    if tuple(info.shape) != expected_shape:
        raise GGUFError(f"{gguf.path}: tensor {name!r} has shape {list(info.shape)}, expected {list(expected_shape)}")
    return info


def _vector(gguf: GGUFFile, name: str, length: int) -> np.ndarray:
    info = _tensor(gguf, name, (length,))
    raw = gguf.tensor_bytes(name)
    if info.quant is F32:
        return raw.reshape(-1).view(np.float32)
    return info.quant.dequantize(raw.reshape(1, -1)).reshape(-1)


def _optional_vector(gguf: GGUFFile, name: str, length: int) -> Optional[np.ndarray]:
    return _vector(gguf, name, length) if name in gguf.tensors else None


def _linear(gguf: GGUFFile, name: str, in_features: int, out_features: int) -> Linear:
    info = _tensor(gguf, name, (in_features, out_features))
    return Linear(name, gguf.tensor_bytes(name), info.quant, in_features)


_MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _megabytes(gguf: GGUFFile, name: str) -> float:
    return gguf.tensors[name].num_bytes / 1e6 if name in gguf.tensors else 0.0


def load_weights(gguf: GGUFFile, config: ModelConfig, progress=no_progress) -> ModelWeights:
    """progress(stage, done, total, unit) hears "repack" after every layer (MB of matrices)."""
    hidden, inter = config.hidden_size, config.intermediate_size
    matrix_mb = [sum(_megabytes(gguf, f"blk.{i}.{m}.weight") for m in _MATRICES) for i in range(config.num_layers)]
    head = "output.weight" if "output.weight" in gguf.tensors else "token_embd.weight"
    total_mb, done_mb = sum(matrix_mb) + _megabytes(gguf, head), 0.0
    layers = []
    for i in range(config.num_layers):
        prefix = f"blk.{i}."
        layers.append(LayerWeights(
            attn_norm=_vector(gguf, prefix + "attn_norm.weight", hidden),
            q=_linear(gguf, prefix + "attn_q.weight", hidden, config.q_size),
            k=_linear(gguf, prefix + "attn_k.weight", hidden, config.kv_size),
            v=_linear(gguf, prefix + "attn_v.weight", hidden, config.kv_size),
            q_bias=_optional_vector(gguf, prefix + "attn_q.bias", config.q_size),
            k_bias=_optional_vector(gguf, prefix + "attn_k.bias", config.kv_size),
            v_bias=_optional_vector(gguf, prefix + "attn_v.bias", config.kv_size),
            o=_linear(gguf, prefix + "attn_output.weight", config.q_size, hidden),
            ffn_norm=_vector(gguf, prefix + "ffn_norm.weight", hidden),
            gate=_linear(gguf, prefix + "ffn_gate.weight", hidden, inter),
            up=_linear(gguf, prefix + "ffn_up.weight", hidden, inter),
            down=_linear(gguf, prefix + "ffn_down.weight", inter, hidden),
        ))
        if config.has_qkv_bias and layers[-1].q_bias is None:
            raise GGUFError(f"{gguf.path}: {config.architecture} needs tensor {prefix + 'attn_q.bias'!r}, missing")
        if config.has_qk_norm:           # RMSNorm weights as stored: gemma3's converter already added the 1
            layers[-1].q_norm = _vector(gguf, prefix + "attn_q_norm.weight", config.head_dim)
            layers[-1].k_norm = _vector(gguf, prefix + "attn_k_norm.weight", config.head_dim)
        if config.has_post_norms:
            layers[-1].post_attn_norm = _vector(gguf, prefix + "post_attention_norm.weight", hidden)
            layers[-1].post_ffn_norm = _vector(gguf, prefix + "post_ffw_norm.weight", hidden)
        done_mb += matrix_mb[i]
        progress("repack", done_mb, total_mb, "MB")
    embedding = _tensor(gguf, "token_embd.weight", (hidden, config.vocab_size))
    embedding_raw = gguf.tensor_bytes("token_embd.weight")
    if "output.weight" in gguf.tensors:
        output = _linear(gguf, "output.weight", hidden, config.vocab_size)
    else:                                                   # tied embeddings
        output = Linear("token_embd.weight", embedding_raw, embedding.quant, hidden)
    progress("repack", total_mb, total_mb, "MB")
    return ModelWeights(
        embedding_raw=embedding_raw,
        embedding_quant=embedding.quant,
        output_norm=_vector(gguf, "output_norm.weight", hidden),
        output=output,
        layers=layers,
        rope_freqs=_optional_vector(gguf, "rope_freqs.weight", config.rotary_dims // 2),
        embedding_rows=gguf.row_reader("token_embd.weight"),
    )
