"""Engine.close(): its side threads end, and dropping the engine unmaps the model and frees the pool."""
import gc
import threading

from edge_slm_node.engine.config import EngineConfig
from edge_slm_node.engine.engine import Engine
from edge_slm_node.engine.sampling import SamplingParams
from tiny_models import write_tiny_model


def mapped(path) -> bool:
    with open("/proc/self/maps") as maps:
        return str(path) in maps.read()


def side_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "edge_slm_side_forward" and t.is_alive())


def test_a_closed_and_dropped_engine_holds_no_model_mapping_and_no_thread(tmp_path):
    path = write_tiny_model(tmp_path / "tiny.gguf")
    threads_before = side_threads()
    engine = Engine(EngineConfig(model_path=str(path), kv_pool_mb=2.0, block_size=8, max_context_tokens=256,
                                 system_prompt="sys", num_threads=3, max_running=4))
    assert side_threads() == threads_before + 2 and mapped(path)
    requests = [engine.submit(sid, "home the Z axis", SamplingParams(max_new_tokens=6, ignore_eos=True),
                              create_if_missing=True) for sid in "abc"]
    while not all(r.done for r in requests):
        engine.step()
    assert engine.runner.split_steps > 0            # the side threads really ran forwards
    engine.close()
    assert side_threads() == threads_before
    del engine, requests
    gc.collect()
    assert not mapped(path)
