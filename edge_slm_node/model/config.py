"""Model hyper-parameters read from GGUF metadata."""
from __future__ import annotations

from dataclasses import dataclass

from .gguf_file import GGUFError, GGUFFile

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")


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
    rope_neox: bool           # qwen2 rotates (i, i + d/2) pairs, llama adjacent pairs
    has_qkv_bias: bool

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> "ModelConfig":
        arch = gguf.require("general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise GGUFError(f"{gguf.path}: architecture {arch!r} unsupported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

        def key(name):
            return gguf.require(f"{arch}.{name}")

        hidden = int(key("embedding_length"))
        num_heads = int(key("attention.head_count"))
        head_dim = hidden // num_heads
        embedding = gguf.tensors.get("token_embd.weight")
        if embedding is None:
            raise GGUFError(f"{gguf.path}: tensor 'token_embd.weight' missing")
        vocab = int(gguf.get(f"{arch}.vocab_size", embedding.shape[1]))
        return cls(
            architecture=arch,
            num_layers=int(key("block_count")),
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
            rope_neox=arch == "qwen2",
            has_qkv_bias=arch == "qwen2",
        )
