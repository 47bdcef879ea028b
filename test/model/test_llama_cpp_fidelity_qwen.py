"""Qwen2.5-Coder-0.5B-Instruct Q4_K_M (weights Q5_0, Q8_0, Q4_K, Q6_K; qwen2 architecture) at
temperature 0: greedy token ids and first-step logits equal llama.cpp's, and our tokenizer gives
llama.cpp's prompt ids.

The fixtures were produced once with llama-cpp-python on the same GGUF file
(bench/make_reference_fixtures.py --model ... --name qwen2.5-coder-0.5b; provenance inside).
That build was a native x86 AVX-512 one, so the engine runs with Transformer(avx512=True) when
the fixture's system_info says so. Each prompt is prefilled as one batch, as llama.cpp did
(the Q4_K and Q6_K kernels sum in the order llama.cpp uses for that batch size).
The model is not part of the repository: the tests skip unless it is installed in
~/.cache/edge_slm_node/models (its sha256 must then be the fixture's)."""
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from edge_slm_node.model.transformer import Transformer
from scattered_greedy import BLOCK, scattered_greedy

FIXTURES = Path(__file__).parents[1] / "fixtures"
GREEDY = json.loads((FIXTURES / "llama_cpp_greedy_qwen2.5-coder-0.5b.json").read_text())
TOKENS = json.loads((FIXTURES / "llama_cpp_tokens_qwen2.5-coder-0.5b.json").read_text())
CASES = GREEDY["cases"]
MODEL_PATH = Path.home() / ".cache" / "edge_slm_node" / "models" / GREEDY["provenance"]["gguf_file"]
AVX512 = "AVX512 = 1" in GREEDY["provenance"]["llama_cpp_system_info"]
MUST_MATCH = 32


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


@pytest.fixture(scope="module")
def model():
    if not MODEL_PATH.is_file():
        pytest.skip(f"{MODEL_PATH} is not installed (Qwen2.5-Coder-0.5B-Instruct Q4_K_M, sha256 "
                    f"{GREEDY['provenance']['gguf_sha256'][:16]}...; the models install step puts it there)")
    assert _sha256(MODEL_PATH) == GREEDY["provenance"]["gguf_sha256"], f"{MODEL_PATH} is not the fixture's file"
    from edge_slm_node.model.loader import load_model
    return load_model(str(MODEL_PATH))


@pytest.fixture(scope="module")
def runner(model):
    return Transformer(model.config, model.weights, max_batch_tokens=512, max_context=640, max_logits_rows=1,
                       avx512=AVX512)


def test_fixture_provenance_and_coverage():
    provenance = GREEDY["provenance"]
    assert provenance["gguf_file"] == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    assert provenance["llama_cpp_python_version"] and provenance["llama_cpp_system_info"]
    assert {"raw_english", "raw_gcode", "chat_cnc_system", "chat_long_system"} <= {c["name"] for c in CASES}
    assert max(len(case["prompt_ids"]) for case in CASES) > 3 * BLOCK
    assert all(len(case["generated_ids"]) >= MUST_MATCH for case in CASES)


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_greedy_ids_equal_llama_cpp(model, runner, case):
    ours, first_logits = scattered_greedy(model, runner, case["prompt_ids"], MUST_MATCH, blocks=40)
    assert ours == case["generated_ids"][:MUST_MATCH]
    top5 = case["top5"][0]
    np.testing.assert_allclose(first_logits[top5["ids"]], top5["logits"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_our_tokenizer_gives_llama_cpp_prompt_ids(model, case):
    assert model.tokenizer.encode(case["prompt_text"]) == case["prompt_ids"]


def test_our_tokenizer_equals_llama_cpp_on_held_out_strings(model):
    """llama.cpp's ids for the held-out strings (Chinese, G-code, code, emoji, special tokens)
    with this GGUF's own pre-tokenizer (qwen2)."""
    assert TOKENS["gguf_pre_tokenizer"] == "qwen2" == model.tokenizer.pre
    for text, ids in zip(TOKENS["strings"], TOKENS["ids"]["qwen2"]):
        assert model.tokenizer.encode(text) == ids, text


def _chatml_messages(prompt_text: str) -> list[dict]:
    """The turns of a ChatML prompt that ends with the assistant's opening, as rendered."""
    body, opening = prompt_text.rsplit("<|im_start|>assistant\n", 1)
    assert opening == "" and body.endswith("<|im_end|>\n"), prompt_text[-80:]
    turns = body[len("<|im_start|>"):-len("<|im_end|>\n")].split("<|im_end|>\n<|im_start|>")
    return [dict(zip(("role", "content"), turn.split("\n", 1))) for turn in turns]


@pytest.mark.parametrize("case", [c for c in CASES if c["kind"] == "chat"], ids=lambda c: c["name"])
def test_gguf_chat_template_renders_llama_cpp_prompt(model, case):
    """llama-cpp-python rendered these prompts with the GGUF's own template (Jinja2ChatFormatter);
    ours renders the same turns to the same text, and without a system turn the template's
    default system prompt (the `default_system` cases were asked that way)."""
    messages = _chatml_messages(case["prompt_text"])
    assert [m["role"] for m in messages] == ["system", "user"]
    assert model.chat_template.render(messages, add_generation_prompt=True) == case["prompt_text"]
    if "You are Qwen, created by Alibaba Cloud." in messages[0]["content"]:
        assert model.chat_template.render(messages[1:], add_generation_prompt=True) == case["prompt_text"]


def test_end_of_generation_ids_are_llama_cpp_s(model):
    """The ids that end an answer come from the GGUF as llama.cpp reads them (its vocab's eog set)."""
    vocab = TOKENS["vocab"]
    assert sorted(model.tokenizer.eog_ids) == vocab["eog_ids"]
    assert model.tokenizer.eos_id == vocab["eos_id"]
