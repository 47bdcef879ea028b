"""Model hyper-parameters read from GGUF metadata, per architecture as llama.cpp reads them."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .gguf_file import GGUFError, GGUFFile

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
SUPPORTED_ROPE_SCALING = ("none",)
GEMMA3_SWA_PATTERN = 6              # llama.cpp: every 6th layer is global, the others sliding-window
GEMMA3_SWA_ROPE_BASE = 10000.0      # llama.cpp's rope_freq_base_train_swa default


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dims: int
    rope_freq_base: float
    rms_norm_eps: float
    context_length: int
    vocab_size: int
    rope_neox: bool           # qwen2, qwen3 and gemma3 rotate (i, i + d/2) pairs, llama adjacent pairs
    has_qkv_bias: bool
    # gemma3 (defaults: llama / qwen2)
    embedding_scale: float = 1.0       # token embeddings multiplied by this (float32) before layer 0
    activation: str = "silu"           # "silu" (SwiGLU) or "gelu" (GeGLU, tanh form)
    has_qk_norm: bool = False          # per-head RMSNorm of q and k before RoPE (qwen3, gemma3)
    has_post_norms: bool = False       # RMSNorm of the attention and FFN outputs before each residual add
    query_scale: float = 1.0           # q multiplied by this (float32) after RoPE
    attention_scale: float = 0.0       # softmax scale of q.k; 0 = 1/sqrt(head_dim)
    sliding_window: int = 0            # positions a sliding-window layer sees (itself included); 0 = none
    swa_layers: tuple = ()             # per layer: True = sliding window (with rope_freq_base_swa)
    rope_freq_base_swa: float = 0.0
    final_logit_softcapping: float = 0.0

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_window(self, layer: int) -> int:
        """Positions layer `layer` attends to (0 = all)."""
        return self.sliding_window if self.swa_layers and self.swa_layers[layer] else 0

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> "ModelConfig":
        arch = gguf.require("general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise GGUFError(f"{gguf.path}: architecture {arch!r} unsupported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

        def key(name):
            return gguf.require(f"{arch}.{name}")

        scaling = gguf.get(f"{arch}.rope.scaling.type", "none")
        if scaling not in SUPPORTED_ROPE_SCALING:
            raise GGUFError(f"{gguf.path}: {arch}.rope.scaling.type = {scaling!r} unsupported "
                            f"(supported: {', '.join(SUPPORTED_ROPE_SCALING)})")
        hidden = int(key("embedding_length"))
        num_heads = int(key("attention.head_count"))
        head_dim = int(gguf.get(f"{arch}.attention.key_length", hidden // num_heads))
        value_dim = int(gguf.get(f"{arch}.attention.value_length", head_dim))
        if value_dim != head_dim:
            raise GGUFError(f"{gguf.path}: attention.key_length {head_dim} != value_length {value_dim} (unsupported)")
        embedding = gguf.tensors.get("token_embd.weight")
        if embedding is None:
            raise GGUFError(f"{gguf.path}: tensor 'token_embd.weight' missing")
        vocab = int(gguf.get(f"{arch}.vocab_size", embedding.shape[1]))
        num_layers = int(key("block_count"))
        common = dict(
            architecture=arch,
            num_layers=num_layers,
            hidden_size=hidden,
            intermediate_size=int(key("feed_forward_length")),
            num_heads=num_heads,
            num_kv_heads=int(gguf.get(f"{arch}.attention.head_count_kv", num_heads)),
            head_dim=head_dim,
            rotary_dims=int(gguf.get(f"{arch}.rope.dimension_count", head_dim)),
            rope_freq_base=float(gguf.get(f"{arch}.rope.freq_base", 10000.0)),
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            context_length=int(key("context_length")),
            vocab_size=vocab,
            rope_neox=arch in ("qwen2", "qwen3", "gemma3"),
            has_qkv_bias=arch == "qwen2",
            has_qk_norm=arch == "qwen3",
        )
        if arch == "gemma3":
            common.update(_gemma3(gguf, num_layers, hidden, num_heads, head_dim))
        return cls(**common)


def _gemma3(gguf: GGUFFile, num_layers: int, hidden: int, num_heads: int, head_dim: int) -> dict:
    """llama.cpp's llama_model_gemma3::load_arch_hparams and its graph's constants."""
    window = int(gguf.get("gemma3.attention.sliding_window", 0))
    pattern = gguf.get("gemma3.attention.sliding_window_pattern", GEMMA3_SWA_PATTERN)
    if window <= 0:
        swa = ()
    elif isinstance(pattern, list):
        if len(pattern) != num_layers:
            raise GGUFError(f"{gguf.path}: gemma3.attention.sliding_window_pattern has {len(pattern)} entries "
                            f"for {num_layers} layers")
        swa = tuple(bool(p) for p in pattern)
    else:
        n = int(pattern)
        swa = tuple(n == 0 or i % n < n - 1 for i in range(num_layers))
    # gemma_pytorch: the 27B scales queries by 1/sqrt(hidden/heads), the others by 1/sqrt(head_dim)
    scale_dim = hidden // num_heads if num_layers == 62 else head_dim
    return dict(
        embedding_scale=float(np.sqrt(np.float32(hidden))),
        activation="gelu",
        has_qk_norm=True,
        has_post_norms=True,
        query_scale=float(np.float32(1.0) / np.sqrt(np.float32(scale_dim))),
        attention_scale=1.0,
        sliding_window=window,
        swa_layers=swa,
        rope_freq_base_swa=float(gguf.get("gemma3.rope.freq_base_swa", GEMMA3_SWA_ROPE_BASE)),
        final_logit_softcapping=float(gguf.get("gemma3.final_logit_softcapping", 0.0) or 0.0),
    )
