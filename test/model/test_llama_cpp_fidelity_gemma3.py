"""Gemma 3 270M Q4_K_M (gemma3 architecture: weights Q5_0, Q8_0, Q4_K, Q6_K, a tied 262k-row Q8_0
head; sliding-window layers) at temperature 0: greedy token ids and first-step logits equal
llama.cpp's, our SentencePiece tokenizer gives llama.cpp's ids, and the chat prompts (the GGUF has
no chat template: llama.cpp's built-in gemma format) render and tokenize as llama.cpp's.

The fixtures were produced once with llama-cpp-python on the same GGUF file
(bench/make_reference_fixtures.py --model ... --name gemma-3-270m; provenance inside), a native
x86 AVX-512 build, so the engine runs with Transformer(avx512=True) when the fixture says so.
Each prompt is prefilled in the chunks llama-cpp-python's Llama.eval used (n_batch tokens, the
logits of each chunk's last token), through a scattered block table. Two cases reach past the
512-position sliding window: one whose decode crosses it, one whose prompt is longer than it.
The model is installed by `edge-slm models install gemma-3-270m-q4_k_m` (scripts/setup.sh does)."""
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from edge_slm_node.model import catalog
from edge_slm_node.model.chat_prompt import ChatPrompt
from edge_slm_node.model.transformer import Transformer
from scattered_greedy import scattered_greedy

FIXTURES = Path(__file__).parents[1] / "fixtures"
GREEDY = json.loads((FIXTURES / "llama_cpp_greedy_gemma-3-270m.json").read_text())
TOKENS = json.loads((FIXTURES / "llama_cpp_tokens_gemma-3-270m.json").read_text())
CASES = GREEDY["cases"]
MODEL = catalog.get("gemma-3-270m-q4_k_m")
AVX512 = "AVX512 = 1" in GREEDY["provenance"]["llama_cpp_system_info"]
N_BATCH = GREEDY["settings"]["n_batch"]
MUST_MATCH = 32


@pytest.fixture(scope="module")
def model():
    if catalog.status(MODEL) != "installed":
        pytest.skip(f"{MODEL.name} is not installed: edge-slm models install {MODEL.name} (scripts/setup.sh does)")
    assert MODEL.sha256 == GREEDY["provenance"]["gguf_sha256"], "the catalog's file is not the fixture's"
    from edge_slm_node.model.loader import load_model
    return load_model(MODEL.name)


@pytest.fixture(scope="module")
def runner(model):
    return Transformer(model.config, model.weights, max_batch_tokens=N_BATCH, max_context=768, max_logits_rows=1,
                       avx512=AVX512)


def test_fixture_provenance_and_coverage(model):
    provenance = GREEDY["provenance"]
    assert provenance["gguf_file"] == "gemma-3-270m-q4_k_m.gguf"
    assert provenance["gguf_sha256"] == MODEL.sha256
    assert provenance["llama_cpp_python_version"] and provenance["llama_cpp_system_info"]
    window = model.config.sliding_window
    assert window == 512 and sum(model.config.swa_layers) == 15          # layers 5, 11, 17 are global
    lengths = {case["name"]: len(case["prompt_ids"]) for case in CASES}
    assert lengths["raw_window_edge"] < window < lengths["raw_window_edge"] + MUST_MATCH
    assert lengths["raw_past_window"] > max(window, N_BATCH)
    assert all(len(case["generated_ids"]) >= MUST_MATCH for case in CASES)


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_greedy_ids_equal_llama_cpp(model, runner, case):
    ours, first_logits = scattered_greedy(model, runner, case["prompt_ids"], MUST_MATCH, blocks=48, chunk=N_BATCH)
    assert ours == case["generated_ids"][:MUST_MATCH]
    top5 = case["top5"][0]
    np.testing.assert_allclose(first_logits[top5["ids"]], top5["logits"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_prompt_ids_and_chat_rendering_equal_llama_cpp(model, case):
    assert model.tokenizer.encode(case["prompt_text"], add_bos=True) == case["prompt_ids"]
    if case["kind"] == "chat":          # llama.cpp rendered without BOS and tokenized with add_bos
        assert model.chat_template.uses_fallback
        assert model.chat_template.render(case["messages"]) == "<bos>" + case["prompt_text"]
        assert ChatPrompt(model.chat_template, model.tokenizer).ids(case["messages"], True) == case["prompt_ids"]


def test_tokenizer_equals_llama_cpp_on_held_out_strings(model):
    """G-code, Chinese, emoji, whitespace runs, special and user-defined tokens, parsed and not."""
    tokenizer = model.tokenizer
    assert TOKENS["tokenizer_model"] == "llama" == tokenizer.model
    strings = TOKENS["strings"]
    assert len(strings) >= 55
    assert [tokenizer.encode(text) for text in strings] == TOKENS["ids"]["default"]
    assert [tokenizer.encode(text, parse_special=False) for text in strings] == TOKENS["ids_not_parsing_special"]
    assert [tokenizer.decode(ids) for ids in TOKENS["ids"]["default"]] == TOKENS["detokenized"]


def test_tokenizer_with_add_space_prefix_equals_llama_cpp(model):
    from edge_slm_node.model.tokenizer import Tokenizer
    metadata = dict(model.gguf.metadata, **{"tokenizer.ggml.add_space_prefix": True})
    tokenizer = Tokenizer.from_metadata(metadata)
    assert [tokenizer.encode(text) for text in TOKENS["strings"]] == TOKENS["ids"]["add_space_prefix"]


def test_vocabulary_facts_equal_llama_cpp(model):
    tokenizer, vocab = model.tokenizer, TOKENS["vocab"]
    assert (tokenizer.vocab_size, tokenizer.bos_id, tokenizer.eos_id) == (vocab["n_vocab"], vocab["bos_id"],
                                                                          vocab["eos_id"])
    assert tokenizer.add_bos_default is vocab["add_bos"] is True
    assert sorted(tokenizer.eog_ids) == vocab["eog_ids"]
    assert tokenizer.token_text(106) == "<end_of_turn>" and tokenizer.is_eog(106)
    digest = hashlib.sha256()
    for token_id in range(tokenizer.vocab_size):
        piece = tokenizer.token_bytes(token_id)
        digest.update(len(piece).to_bytes(4, "little") + piece)
    assert digest.hexdigest() == vocab["token_pieces_sha256"]
