"""Small random GGUFs of what no real file here has, against llama.cpp: greedy ids and every step's
logits. qwen3: per-head q/k norm, no q/k/v bias, head_dim from key_length (2x hidden / heads here);
llama with Llama 3.x RoPE frequency factors (rope_freqs.weight).

test/fixtures/llama_cpp_tiny_models.json was made by test/fixtures/make_tiny_llama_cpp_fixture.py
(llama-cpp-python; provenance inside) from files test/tiny_models.py writes; each test writes its
file again and checks it is byte-identical (sha256) to the one llama.cpp ran."""
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from edge_slm_node.kernels import quants
from edge_slm_node.kv.arena import KVArena
from edge_slm_node.model.loader import load_model
from edge_slm_node.model.transformer import ForwardBatch, Transformer
from tiny_models import reference_logits, write_tiny_model

FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "llama_cpp_tiny_models.json").read_text())
AVX512 = "AVX512 = 1" in FIXTURE["provenance"]["llama_cpp_system_info"]
BLOCK = 8


def write(tmp_path, case):
    kwargs = dict(case["write_tiny_model"])
    kwargs["weight_quant"] = getattr(quants, kwargs["weight_quant"])
    kwargs["embedding_quant"] = getattr(quants, kwargs["embedding_quant"])
    path = write_tiny_model(tmp_path / f"{case['name']}.gguf", **kwargs)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == case["sha256"], "not the file llama.cpp ran"
    return path


def greedy(model, prompt_ids, count):
    config = model.config
    arena = KVArena(config.num_layers, config.num_kv_heads, config.head_dim, num_blocks=8, block_size=BLOCK)
    runner = Transformer(config, model.weights, max_batch_tokens=32, max_context=64, max_logits_rows=1,
                         avx512=AVX512)
    table = np.random.default_rng(0).permutation(8).astype(np.int32)[None, :]

    def run(tokens, start):
        pos = np.arange(start, start + len(tokens), dtype=np.int32)
        batch = ForwardBatch(np.array(tokens, np.int32), pos, np.zeros(len(tokens), np.int32), pos + 1,
                             (table[0, pos // BLOCK] * BLOCK + pos % BLOCK).astype(np.int32), table,
                             np.array([len(tokens) - 1], np.int32))
        return runner.forward(batch, arena.data)[0].copy()

    rows = [run(prompt_ids, 0)]
    ids = []
    for _ in range(count):
        ids.append(int(np.argmax(rows[-1])))
        rows.append(run([ids[-1]], len(prompt_ids) + len(ids) - 1))
    return ids, np.array(rows[:-1])


QWEN3 = [case for case in FIXTURE["cases"] if case["write_tiny_model"]["arch"] == "qwen3"]
LLAMA3 = [case for case in FIXTURE["cases"] if case["write_tiny_model"].get("rope_freqs")]


@pytest.mark.parametrize("case", QWEN3, ids=[case["name"] for case in QWEN3])
def test_qwen3_greedy_ids_and_logits_equal_llama_cpp(tmp_path, case):
    model = load_model(str(write(tmp_path, case)))
    config = model.config
    assert config.architecture == "qwen3" and config.has_qk_norm and not config.has_qkv_bias
    assert config.head_dim == 2 * config.hidden_size // config.num_heads
    ids, logits = greedy(model, case["prompt_ids"], len(case["generated_ids"]))
    assert ids == case["generated_ids"]
    np.testing.assert_allclose(logits, np.array(case["logits"], np.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", LLAMA3, ids=[case["name"] for case in LLAMA3])
def test_llama3_rope_frequency_factors_equal_llama_cpp(tmp_path, case):
    model = load_model(str(write(tmp_path, case)))
    assert model.weights.rope_freqs is not None and model.weights.rope_freqs.shape == (model.config.rotary_dims // 2,)
    ids, logits = greedy(model, case["prompt_ids"], len(case["generated_ids"]))
    assert ids == case["generated_ids"]
    expected = np.array(case["logits"], np.float32)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    model.weights.rope_freqs = None                  # the factors matter: without them the logits move
    assert np.abs(greedy(model, case["prompt_ids"], 2)[1] - expected[:2]).max() > 1e-3


@pytest.mark.parametrize("case", FIXTURE["cases"][:1], ids=[FIXTURE["cases"][0]["name"]])
def test_the_float64_reference_agrees_with_llama_cpp(tmp_path, case):
    """The NumPy reference forward (test_tiny_models.py uses it for every family) reads qwen3 as
    llama.cpp does: its logits for the prompt's last token are close to llama.cpp's."""
    expected = np.array(case["logits"][0])
    ours = reference_logits(write(tmp_path, case), case["prompt_ids"])[-1]
    assert np.abs(ours - expected).max() <= 0.03 * np.abs(expected).max()
    assert int(np.argmax(ours)) == int(np.argmax(expected))
