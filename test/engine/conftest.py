import os

import pytest

from edge_slm_node.engine.config import EngineConfig
from edge_slm_node.engine.engine import Engine
from edge_slm_node.kv.arena import bytes_per_token
from edge_slm_node.model.loader import load_model

SHORT_SYSTEM_PROMPT = "You are the assistant of CNC cell 3. Answer briefly."


@pytest.fixture(scope="session")
def smollm():
    """The real SmolLM2-135M-Instruct Q4_1 GGUF, loaded once for the whole run (another model:
    EDGE_SLM_TEST_MODEL=<path or catalog name>, to run the suite against it once)."""
    return load_model(os.environ.get("EDGE_SLM_TEST_MODEL", ""))


@pytest.fixture
def make_engine(smollm):
    """Engines on the real model, with guard zones on: every step of every engine test checks that
    no kernel wrote past a buffer or a KV block."""
    def make(**overrides):
        settings = dict(kv_pool_mb=8, max_context_tokens=512, system_prompt=SHORT_SYSTEM_PROMPT, guard_zones=True)
        settings.update(overrides)
        return Engine(EngineConfig(**settings), model=smollm)
    return make


def pool_mb_for_tokens(model, tokens: int) -> float:
    """kv_pool_mb that holds `tokens` tokens of this model (pools sized in tokens keep a test's
    pressure the same under EDGE_SLM_TEST_MODEL)."""
    config = model.config
    return tokens * bytes_per_token(config.num_layers, config.num_kv_heads, config.head_dim) / 2**20


def run_to_completion(engine, requests, max_steps=10000):
    for _ in range(max_steps):
        if all(r.done for r in requests):
            return
        engine.step()
    raise AssertionError("requests did not finish")


def assert_pool_consistent(engine):
    engine.kv.check_invariants()
    stats = engine.stats()
    assert stats.free_blocks + stats.cached_blocks + stats.used_blocks == stats.total_blocks
