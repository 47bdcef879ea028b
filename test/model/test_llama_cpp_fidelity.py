"""Greedy token ids and first-step logits of the real SmolLM2 GGUF equal llama.cpp's.

The fixture was produced once with llama-cpp-python on the same GGUF file
(bench/make_reference_fixtures.py; provenance inside the JSON)."""
import json
from pathlib import Path

import numpy as np
import pytest

from edge_slm_node.model.transformer import Transformer
from scattered_greedy import BLOCK, scattered_greedy

FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "llama_cpp_greedy.json").read_text())
CASES = FIXTURE["cases"]
MUST_MATCH = 32


@pytest.fixture(scope="module")
def model():
    from edge_slm_node.model.loader import load_model
    return load_model()


@pytest.fixture(scope="module")
def runner(model):
    return Transformer(model.config, model.weights, max_batch_tokens=128, max_context=512, max_logits_rows=1)


def test_fixture_covers_the_required_prompts():
    names = {case["name"] for case in CASES}
    assert {"raw_english", "raw_chinese", "raw_gcode", "chat_cnc_system", "chat_long_system"} <= names
    assert max(len(case["prompt_ids"]) for case in CASES) > 3 * BLOCK
    assert all(len(case["generated_ids"]) >= MUST_MATCH for case in CASES)


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_greedy_ids_equal_llama_cpp(model, runner, case):
    ours, first_logits = scattered_greedy(model, runner, case["prompt_ids"], MUST_MATCH, blocks=40, chunk=128)
    assert ours == case["generated_ids"][:MUST_MATCH]
    top5 = case["top5"][0] if isinstance(case["top5"], list) else case["top5"]
    np.testing.assert_allclose(first_logits[top5["ids"]], top5["logits"], rtol=0.02, atol=0.1)


@pytest.mark.parametrize("case", [c for c in CASES if c["kind"] == "raw"], ids=lambda c: c["name"])
def test_our_tokenizer_gives_llama_cpp_prompt_ids(model, case):
    assert model.tokenizer.encode(case["prompt_text"]) == case["prompt_ids"]
