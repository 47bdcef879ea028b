"""Greedy token ids and first-step logits of the real SmolLM2 GGUF equal llama.cpp's.

The fixture was produced once with llama-cpp-python on the same GGUF file
(bench/make_reference_fixtures.py; provenance inside the JSON)."""
import json
from pathlib import Path

import numpy as np
import pytest

from edge_slm_node.kv.arena import KVArena
from edge_slm_node.model.transformer import ForwardBatch, Transformer

FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "llama_cpp_greedy.json").read_text())
CASES = FIXTURE["cases"]
MUST_MATCH = 32
BLOCK = 16


@pytest.fixture(scope="module")
def model():
    from edge_slm_node.model.loader import load_model
    return load_model()


@pytest.fixture(scope="module")
def runner(model):
    return Transformer(model.config, model.weights, max_batch_tokens=128, max_context=512, max_logits_rows=1)


def greedy(model, runner, prompt_ids, count):
    """Prefill in 128-token chunks through a scattered block table, then decode greedily."""
    arena = KVArena(model.config.num_layers, model.config.num_kv_heads, model.config.head_dim, num_blocks=40, block_size=BLOCK)
    table = np.random.default_rng(len(prompt_ids)).permutation(40).astype(np.int32)[None, :]

    def run(tokens, start):
        pos = np.arange(start, start + len(tokens), dtype=np.int32)
        slots = (table[0, pos // BLOCK] * BLOCK + pos % BLOCK).astype(np.int32)
        batch = ForwardBatch(np.array(tokens, np.int32), pos, np.zeros(len(tokens), np.int32), pos + 1, slots,
                             table, np.array([len(tokens) - 1], np.int32))
        return runner.forward(batch, arena.data)[0].copy()

    for start in range(0, len(prompt_ids), 128):
        logits = run(prompt_ids[start:start + 128], start)
    first_logits = logits
    out = []
    for _ in range(count):
        out.append(int(np.argmax(logits)))
        logits = run([out[-1]], len(prompt_ids) + len(out) - 1)
    return out, first_logits


def test_fixture_covers_the_required_prompts():
    names = {case["name"] for case in CASES}
    assert {"raw_english", "raw_chinese", "raw_gcode", "chat_cnc_system", "chat_long_system"} <= names
    assert max(len(case["prompt_ids"]) for case in CASES) > 3 * BLOCK
    assert all(len(case["generated_ids"]) >= MUST_MATCH for case in CASES)


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_greedy_ids_equal_llama_cpp(model, runner, case):
    ours, first_logits = greedy(model, runner, case["prompt_ids"], MUST_MATCH)
    assert ours == case["generated_ids"][:MUST_MATCH]
    top5 = case["top5"][0] if isinstance(case["top5"], list) else case["top5"]
    np.testing.assert_allclose(first_logits[top5["ids"]], top5["logits"], rtol=0.02, atol=0.1)


@pytest.mark.parametrize("case", [c for c in CASES if c["kind"] == "raw"], ids=lambda c: c["name"])
def test_our_tokenizer_gives_llama_cpp_prompt_ids(model, case):
    assert model.tokenizer.encode(case["prompt_text"]) == case["prompt_ids"]
