"""On a K-quant model (Qwen2.5-Coder-0.5B Q4_K_M: Q4_K, Q6_K, Q5_0, Q8_0) a session's greedy
answer is the one it gets alone, however the scheduler batches, chunks or preempts it: each
token is summed in the order of the llama.cpp call that would compute it alone
(engine/llama_calls.py), though the K-quant kernels' orders depend on a call's size."""
from pathlib import Path

import pytest

from conftest import SHORT_SYSTEM_PROMPT, assert_pool_consistent, pool_mb_for_tokens, run_to_completion
from edge_slm_node.engine.config import EngineConfig
from edge_slm_node.engine.engine import Engine
from edge_slm_node.engine.sampling import SamplingParams
from edge_slm_node.model.loader import load_model

QWEN = Path.home() / ".cache" / "edge_slm_node" / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)
PROMPTS = {"a": "What is G01?", "b": "Why does spindle 2 alarm after the tool change?", "c": "Shut off valve three.",
           "d": "List three checks before starting the lathe."}


@pytest.fixture(scope="module")
def qwen():
    if not QWEN.is_file():
        pytest.skip("qwen2.5-coder-0.5b-instruct-q4_k_m is not installed (scripts/setup.sh installs it)")
    return load_model(str(QWEN))


def _engine(model, **overrides):
    settings = dict(kv_pool_mb=pool_mb_for_tokens(model, 2048), max_context_tokens=512,
                    system_prompt=SHORT_SYSTEM_PROMPT, guard_zones=True)
    settings.update(overrides)
    return Engine(EngineConfig(**settings), model=model)


@pytest.fixture(scope="module")
def alone(qwen):
    """Each prompt's answer with its session alone in the engine."""
    engine = _engine(qwen)
    answers = {}
    for sid, text in PROMPTS.items():
        engine.create_session(sid)
        request = engine.submit(sid, text, GREEDY)
        run_to_completion(engine, [request])
        answers[sid] = request.generated_ids
    return answers


def _together(engine, **session_options):
    for sid in PROMPTS:
        engine.create_session(sid, **session_options)
    requests = [engine.submit(sid, text, GREEDY) for sid, text in PROMPTS.items()]
    run_to_completion(engine, requests)
    return requests


@pytest.mark.parametrize("threads", [1, 2])
def test_sessions_batched_answer_as_alone(qwen, alone, threads):
    """Four prompts in one prompt step, then decoded four at a time (Q4_K gemm tiles and Q6_K's
    tiled order would otherwise take the decode rows)."""
    engine = _engine(qwen, num_threads=threads)
    requests = _together(engine)
    assert {r.session_id: r.generated_ids for r in requests} == alone
    assert_pool_consistent(engine)


def test_chunked_prompts_sharing_steps_answer_as_alone(qwen, alone):
    """max_batch_tokens 7: every prompt is cut into chunks that share steps with other prompts'
    chunks and with decoding rows."""
    engine = _engine(qwen, max_batch_tokens=7, max_running=4)
    requests = _together(engine)
    assert {r.session_id: r.generated_ids for r in requests} == alone
    assert_pool_consistent(engine)


def test_preempted_requests_recompute_as_alone(qwen, alone):
    """A pool too small for four answers at once: the newest are preempted, their KV freed and
    recomputed later, prompt and generated tokens alike, in the orders they first had."""
    engine = _engine(qwen, kv_pool_mb=pool_mb_for_tokens(qwen, 160))
    baseline = engine.stats().used_blocks
    requests = _together(engine, keep_history=False)
    assert engine.stats().preemptions > 0
    assert {r.session_id: r.generated_ids for r in requests} == alone
    for sid in PROMPTS:
        engine.destroy_session(sid)
    assert engine.stats().used_blocks == baseline
    assert_pool_consistent(engine)
