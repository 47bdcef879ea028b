"""Loading reports its stages in order, with MB / token figures, and LoadProgress logs them."""
import logging

from edge_slm_node.engine.config import EngineConfig
from edge_slm_node.engine.engine import Engine
from edge_slm_node.model.load_progress import LoadProgress
from tiny_models import write_tiny_model


class Recorder(LoadProgress):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __call__(self, stage, done, total, unit=""):
        self.calls.append((stage, done, total, unit))
        super().__call__(stage, done, total, unit)


def test_engine_start_reports_every_stage_in_order_and_logs_it(tmp_path, caplog):
    path = write_tiny_model(tmp_path / "tiny.gguf", layers=3)
    progress = Recorder()
    with caplog.at_level(logging.INFO, logger="edge_slm_node.loading"):
        Engine(EngineConfig(model_path=str(path), kv_pool_mb=1.0, block_size=8, max_context_tokens=256,
                            system_prompt="You are a CNC assistant. " * 8, max_batch_tokens=16), progress=progress)
    stages = list(dict.fromkeys(stage for stage, *_ in progress.calls))
    assert stages == ["map", "repack", "tokenizer", "KV pool and buffers", "kernels", "shared-prompt prefill"]
    for stage in stages:
        last = [c for c in progress.calls if c[0] == stage][-1]
        assert last[1] == last[2] > 0, last                      # every stage ends complete
    repacked = [done for stage, done, _, _ in progress.calls if stage == "repack"]
    assert len(repacked) == 3 + 1 and repacked == sorted(repacked)   # after each layer, then the head
    prefill = [c for c in progress.calls if c[0] == "shared-prompt prefill"]
    assert prefill[0][1] == 0 and prefill[-1][3] == "tokens" and len(prefill) >= 3   # > 16 tokens: chunks
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("loading: repack ") and "MB (100 %)" in line for line in lines), lines
    assert lines[-1].startswith("loaded in ") and progress.stage is None
