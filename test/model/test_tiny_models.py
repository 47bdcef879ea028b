"""Our forward pass on small random GGUF files (llama, qwen2, qwen3 and gemma3 layouts, several quant types)
against a float64 NumPy reference that reads the same file."""
import threading
import time

import numpy as np
import pytest

from edge_slm_node.kv.arena import KVArena
from edge_slm_node.kernels import quants as q
from edge_slm_node.model.gguf_file import GGUFError
from edge_slm_node.model.loader import load_model
from edge_slm_node.kernels.team import new_sync
from edge_slm_node.model.transformer import ForwardBatch, TeamAborted, TeamRole, Transformer
from tiny_models import GEMMA3_WINDOW, reference_logits, write_tiny_model

BLOCK = 4


def run_paged(model, token_ids, chunks, parallel=True, members=1, last_rows=False):
    """Prefill token_ids in the given chunk sizes through a scattered block table -> logits per token
    (last_rows: of each chunk's last token only, as a prompt's chunks are run).
    members > 1: each forward run by a team of that many threads (model/transformer.py TeamRole)."""
    config = model.config
    arena = KVArena(config.num_layers, config.num_kv_heads, config.head_dim, num_blocks=32, block_size=BLOCK)
    transformers = [Transformer(config, model.weights, max_batch_tokens=64, max_context=128, max_logits_rows=64)
                    for _ in range(members)]
    table = np.random.default_rng(0).permutation(32).astype(np.int32)[None, :]
    logits, start = [], 0
    for size in chunks:
        ids = np.array(token_ids[start:start + size], np.int32)
        pos = np.arange(start, start + size, dtype=np.int32)
        slots = (table[0, pos // BLOCK] * BLOCK + pos % BLOCK).astype(np.int32)
        rows = np.array([size - 1], np.int32) if last_rows else np.arange(size, dtype=np.int32)
        batch = ForwardBatch(ids, pos, np.zeros(size, np.int32), pos + 1, slots, table, rows)
        if members == 1:
            logits.append(transformers[0].forward(batch, arena.data, parallel=parallel).copy())
        else:
            logits.append(team_forward(transformers, batch, arena.data).copy())
        start += size
    return np.concatenate(logits)


def team_forward(transformers, batch, kv_arena):
    """One forward by a team: transformers[0] leads on this thread, the others on threads of their own."""
    sync, members = new_sync(), len(transformers)
    lead = transformers[0]
    others = [threading.Thread(target=t.forward, args=(batch, kv_arena, False, TeamRole(m, members, lead, sync)))
              for m, t in enumerate(transformers[1:], start=1)]
    for thread in others:
        thread.start()
    logits = lead.forward(batch, kv_arena, parallel=False, team=TeamRole(0, members, lead, sync))
    for thread in others:
        thread.join()
    return logits


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
@pytest.mark.parametrize("weight_quant,embedding_quant,tolerance", [
    (q.F32, q.F32, 0.01), (q.F16, q.F16, 0.01), (q.Q8_0, q.Q8_0, 0.03), (q.Q4_0, q.Q8_0, 0.05),
    (q.Q4_1, q.Q8_0, 0.05), (q.Q4_1, q.Q4_1, 0.05)])
def test_forward_matches_numpy_reference(tmp_path, arch, weight_quant, embedding_quant, tolerance):
    path = write_tiny_model(tmp_path / "tiny.gguf", arch, weight_quant, embedding_quant, tied=arch == "llama")
    model = load_model(str(path))
    tokens = list(np.random.default_rng(1).integers(0, model.config.vocab_size, 11))
    ours = run_paged(model, tokens, [11])
    expected = reference_logits(path, tokens)
    scale = np.abs(expected).max()
    assert np.abs(ours - expected).max() <= tolerance * scale, (np.abs(ours - expected).max(), scale)
    assert (ours.argmax(1) == expected.argmax(1)).mean() >= 0.8


def test_chunked_prefill_equals_one_pass(tmp_path):
    path = write_tiny_model(tmp_path / "tiny.gguf")
    model = load_model(str(path))
    tokens = list(np.random.default_rng(2).integers(0, model.config.vocab_size, 13))
    whole = run_paged(model, tokens, [13])
    pieces = run_paged(model, tokens, [5, 1, 4, 3])       # chunk edges inside and across blocks
    np.testing.assert_array_equal(whole, pieces)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
@pytest.mark.parametrize("weight_quant", [q.Q4_1, q.Q4_0, q.Q8_0, q.F16])
def test_single_threaded_forward_equals_the_thread_pool_one(tmp_path, arch, weight_quant):
    """forward(parallel=False) runs every kernel on the calling thread, parallel=True the big ones
    on the pool: bit-equal, for prompt chunks and one-token steps, with and without biases."""
    path = write_tiny_model(tmp_path / "tiny.gguf", arch, weight_quant, tied=arch == "llama")
    model = load_model(str(path))
    tokens = list(np.random.default_rng(3).integers(0, model.config.vocab_size, 13))
    chunks = [6, 1, 4, 1, 1]
    np.testing.assert_array_equal(run_paged(model, tokens, chunks, parallel=False),
                                  run_paged(model, tokens, chunks, parallel=True))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
@pytest.mark.parametrize("weight_quant", [q.Q4_1, q.Q4_0, q.Q8_0, q.F16, q.F32])
def test_a_team_of_threads_gives_the_single_threaded_forward(tmp_path, arch, weight_quant):
    """Two and three threads running each forward together (rows of every matmul split, token rows
    of the norms, RoPE and residual adds and columns of the gated unit split, barriers between):
    bit-equal to one thread, prompt chunks and one-token steps, every token's logits or each
    chunk's last (the kept rows gathered in the last layer)."""
    path = write_tiny_model(tmp_path / "tiny.gguf", arch, weight_quant, tied=arch == "llama")
    model = load_model(str(path))
    tokens = list(np.random.default_rng(3).integers(0, model.config.vocab_size, 13))
    chunks = [6, 1, 4, 1, 1]
    alone = run_paged(model, tokens, chunks, parallel=False)
    np.testing.assert_array_equal(run_paged(model, tokens, chunks, members=2), alone)
    np.testing.assert_array_equal(run_paged(model, tokens, chunks, members=3), alone)
    last_alone = run_paged(model, tokens, chunks, parallel=False, last_rows=True)
    np.testing.assert_array_equal(last_alone, alone[np.cumsum(chunks) - 1])
    np.testing.assert_array_equal(run_paged(model, tokens, chunks, members=2, last_rows=True), last_alone)


def test_a_team_whose_member_never_comes_is_given_up(tmp_path):
    """A forward's team member that never starts: the lead stops waiting after its patience and
    raises TeamAborted, instead of hanging the engine thread."""
    model = load_model(str(write_tiny_model(tmp_path / "tiny.gguf")))
    config = model.config
    arena = KVArena(config.num_layers, config.num_kv_heads, config.head_dim, num_blocks=8, block_size=BLOCK)
    lead = Transformer(config, model.weights, max_batch_tokens=8, max_context=32, max_logits_rows=8)
    table = np.arange(8, dtype=np.int32)[None, :]
    pos = np.arange(3, dtype=np.int32)
    batch = ForwardBatch(np.array([1, 2, 3], np.int32), pos, np.zeros(3, np.int32), pos + 1, pos, table, pos)
    started = time.monotonic()
    with pytest.raises(TeamAborted, match="team of 2 was given up"):
        lead.forward(batch, arena.data, parallel=False, team=TeamRole(0, 2, lead, new_sync(), patience_s=0.2))
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("weight_quant,tolerance", [(q.F32, 0.01), (q.Q8_0, 0.03)])
def test_gemma3_sliding_window_past_the_window_matches_numpy_reference(tmp_path, weight_quant, tolerance):
    """100 tokens with a 20-position window on the local layers (the third layer global), prefilled
    in chunks and then one token at a time: every token's logits against the float64 reference
    with the window mask."""
    path = write_tiny_model(tmp_path / "tiny.gguf", "gemma3", weight_quant, q.Q8_0, layers=3)
    model = load_model(str(path))
    assert model.config.swa_layers == (True, True, False) and model.config.sliding_window == GEMMA3_WINDOW
    assert model.config.head_dim == 32 and model.config.q_size == 128 != model.config.hidden_size
    tokens = list(np.random.default_rng(4).integers(0, model.config.vocab_size, 100))
    ours = run_paged(model, tokens, [40, 30, 25, 1, 1, 1, 1, 1])
    expected = reference_logits(path, tokens)
    scale = np.abs(expected).max()
    assert np.abs(ours - expected).max() <= tolerance * scale, (np.abs(ours - expected).max(), scale)
    assert (ours.argmax(1) == expected.argmax(1)).mean() >= 0.9
    full_window = reference_logits(path, tokens, window=0)        # the window is not a no-op here
    assert np.abs(full_window - expected)[GEMMA3_WINDOW + 5:].max() > 10 * np.abs(ours - expected).max()


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_unsupported_rope_scaling_is_named_with_what_is_supported(tmp_path, arch):
    path = write_tiny_model(tmp_path / "tiny.gguf", arch, extra_metadata={f"{arch}.rope.scaling.type": "yarn"})
    with pytest.raises(GGUFError, match=f"{arch}.rope.scaling.type = 'yarn' unsupported \\(supported: none"):
        load_model(str(path))


def test_forward_checks_the_context_before_the_kernels(tmp_path):
    model = load_model(str(write_tiny_model(tmp_path / "tiny.gguf")))
    transformer = Transformer(model.config, model.weights, max_batch_tokens=4, max_context=8, max_logits_rows=4)
    arena = KVArena(model.config.num_layers, model.config.num_kv_heads, model.config.head_dim, num_blocks=4, block_size=BLOCK)
    table = np.arange(4, dtype=np.int32)[None, :]
    batch = ForwardBatch(np.array([1], np.int32), np.array([8], np.int32), np.zeros(1, np.int32),
                         np.array([9], np.int32), np.array([8], np.int32), table, np.zeros(1, np.int32))
    with pytest.raises(ValueError, match="context 9 > max_context 8"):
        transformer.forward(batch, arena.data, parallel=False)


def test_unsupported_architecture_and_truncation_are_clear_errors(tmp_path):
    path = write_tiny_model(tmp_path / "tiny.gguf")
    data = path.read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(data[: len(data) - 100])
    with pytest.raises(GGUFError, match="truncated"):
        load_model(str(truncated))
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"NOPE" + data[4:])
    with pytest.raises(GGUFError, match="not a GGUF file"):
        load_model(str(garbage))
    renamed = tmp_path / "gpt.gguf"
    renamed.write_bytes(data.replace(b"llama", b"gptxx", 1))
    with pytest.raises(GGUFError, match="architecture 'gptxx' unsupported"):
        load_model(str(renamed))
    with pytest.raises(FileNotFoundError, match="model file not found"):
        load_model(str(tmp_path / "missing.gguf"))
