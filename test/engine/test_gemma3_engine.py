"""The engine on the real Gemma 3 270M Q4_K_M: the shared CNC prompt (which Gemma's template, having
no system role, puts inside the first user turn) is prefilled once and shared, the prefix cache
serves sessions with the same custom prompt, and conversations longer than the 512-position
sliding window keep answering as a fresh computation of the same ids does.
Installed by `edge-slm models install gemma-3-270m-q4_k_m` (scripts/setup.sh does)."""
from pathlib import Path

import numpy as np
import pytest

from edge_slm_node.engine.config import EngineConfig
from edge_slm_node.engine.engine import Engine
from edge_slm_node.engine.sampling import SamplingParams
from edge_slm_node.kv.arena import KVArena
from edge_slm_node.model import catalog
from edge_slm_node.model.loader import load_model
from edge_slm_node.model.transformer import ForwardBatch, Transformer

from conftest import assert_pool_consistent, run_to_completion

MODEL = catalog.get("gemma-3-270m-q4_k_m")
CNC_PROMPT = (Path(__file__).parents[2] / "config" / "cnc_system_prompt.txt").read_text(encoding="utf-8")
GREEDY = SamplingParams(max_new_tokens=16, ignore_eos=True)
START_OF_TURN, NEWLINES_2 = 105, 108


@pytest.fixture(scope="module")
def gemma():
    if catalog.status(MODEL) != "installed":
        pytest.skip(f"{MODEL.name} is not installed: edge-slm models install {MODEL.name}")
    return load_model(MODEL.name)


def make(gemma, **overrides):
    settings = dict(kv_pool_mb=40, max_context_tokens=1024, system_prompt=CNC_PROMPT, guard_zones=True)
    settings.update(overrides)
    return Engine(EngineConfig(**settings), model=gemma)


def answer(engine, session_id, text, params=GREEDY):
    request = engine.submit(session_id, text, params)
    run_to_completion(engine, [request])
    return request


def test_the_shared_cnc_prompt_is_the_first_user_turn_prefilled_once(gemma):
    engine = make(gemma)
    prefix = engine.prefix_ids
    assert prefix[:3] == [gemma.tokenizer.bos_id, START_OF_TURN, gemma.tokenizer.encode("user")[0]]
    assert prefix[-1] == NEWLINES_2 and len(prefix) > 250       # the system text, then the blank line
    pinned = engine.stats().shared_blocks
    assert pinned == len(prefix) // engine.config.block_size
    engine.create_session("a")
    engine.create_session("b")
    first, second = answer(engine, "a", "What does M03 do?"), answer(engine, "b", "What does M03 do?")
    for request in (first, second):
        assert request.prompt_ids[:len(prefix)] == prefix
        assert request.cached_prompt_tokens >= len(prefix) - 1      # forked from the pinned prompt
    assert first.generated_ids == second.generated_ids
    assert engine.stats().shared_blocks >= pinned
    assert_pool_consistent(engine)


def test_prefix_cache_serves_a_second_session_with_the_same_custom_prompt(gemma):
    engine = make(gemma, system_prompt=None)
    custom = "You are the assistant of lathe 4. " * 12
    engine.create_session("c", system_prompt=custom)
    engine.create_session("d", system_prompt=custom)
    first = answer(engine, "c", "Which tool is loaded?")
    second = answer(engine, "d", "Which tool is loaded?")
    assert first.cached_prompt_tokens == 0
    assert second.cached_prompt_tokens >= len(engine.sessions["d"].prefix_ids) // engine.config.block_size \
        * engine.config.block_size
    assert first.generated_ids == second.generated_ids
    assert_pool_consistent(engine)


def direct_greedy(gemma, prompt_ids, count, chunk):
    """The same prompt through a bare Transformer, prefilled in `chunk`-token steps, then decoded."""
    block = 16
    arena = KVArena(gemma.config.num_layers, gemma.config.num_kv_heads, gemma.config.head_dim, num_blocks=72,
                    block_size=block)
    runner = Transformer(gemma.config, gemma.weights, max_batch_tokens=chunk, max_context=1024, max_logits_rows=1)
    table = np.arange(72, dtype=np.int32)[None, :]

    def run(tokens, start):
        pos = np.arange(start, start + len(tokens), dtype=np.int32)
        batch = ForwardBatch(np.array(tokens, np.int32), pos, np.zeros(len(tokens), np.int32), pos + 1,
                             (table[0, pos // block] * block + pos % block).astype(np.int32), table,
                             np.array([len(tokens) - 1], np.int32))
        return runner.forward(batch, arena.data)[0]

    for start in range(0, len(prompt_ids), chunk):
        logits = run(prompt_ids[start:start + chunk], start)
    out = []
    for _ in range(count):
        out.append(int(np.argmax(logits)))
        logits = run([out[-1]], len(prompt_ids) + len(out) - 1)
    return out


def test_a_conversation_past_the_sliding_window_answers_as_computed_directly(gemma):
    """Four turns on the CNC prompt (~275 tokens) reach past 512 positions: the engine's answer
    (shared prompt blocks, history KV reused across turns) equals a direct greedy run of the same
    prompt ids prefilled in the engine's step size."""
    engine = make(gemma)
    engine.create_session("long")
    params = SamplingParams(max_new_tokens=80, ignore_eos=True)
    for text in ("Explain G54 work offsets.", "And tool length offsets with G43?", "What does G28 do?"):
        answer(engine, "long", text, params)
    last = answer(engine, "long", "Summarize both in one sentence.", SamplingParams(max_new_tokens=24,
                                                                                      ignore_eos=True))
    assert len(last.prompt_ids) > gemma.config.sliding_window
    assert last.cached_prompt_tokens > gemma.config.sliding_window - 64
    assert direct_greedy(gemma, last.prompt_ids, 24, engine.config.max_batch_tokens) == last.generated_ids
    assert_pool_consistent(engine)
