"""engine/prefix_kv_cache.py on the real model: a second engine reads the shared prompt's KV from
the file the first wrote (bit-equal blocks, the same answers); a damaged or foreign file is
ignored and rewritten."""
import numpy as np

from conftest import run_to_completion
from edge_slm_node.engine.sampling import SamplingParams
from edge_slm_node.engine.scheduler import PREFIX_SEQ_KEY

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


def _prefix_blocks(engine):
    return np.array(engine.arena.storage[:, :, engine.kv.block_table(PREFIX_SEQ_KEY)])


def _answer(engine, text="What does M06 do?"):
    engine.create_session("s")
    request = engine.submit("s", text, GREEDY)
    run_to_completion(engine, [request])
    return request.generated_ids


def test_a_restart_reads_the_shared_prompt_kv_and_answers_the_same(make_engine, tmp_path):
    first = make_engine(prefix_kv_cache=True, prefix_kv_cache_dir=str(tmp_path))
    assert not first.prefix_from_cache
    files = list(tmp_path.glob("*.npy"))
    assert len(files) == 1
    second = make_engine(prefix_kv_cache=True, prefix_kv_cache_dir=str(tmp_path))
    assert second.prefix_from_cache
    np.testing.assert_array_equal(_prefix_blocks(second), _prefix_blocks(first))
    assert second.kv.token_ids(PREFIX_SEQ_KEY) == first.kv.token_ids(PREFIX_SEQ_KEY)
    assert _answer(second) == _answer(first)
    other = make_engine(prefix_kv_cache=True, prefix_kv_cache_dir=str(tmp_path), system_prompt="You run lathe 2.")
    assert not other.prefix_from_cache                     # another prompt: another file
    assert len(list(tmp_path.glob("*.npy"))) == 2


def test_a_damaged_file_is_ignored_and_rewritten(make_engine, tmp_path):
    first = make_engine(prefix_kv_cache=True, prefix_kv_cache_dir=str(tmp_path))
    path = next(tmp_path.glob("*.npy"))
    path.write_bytes(path.read_bytes()[:1000])             # cut short, as by a crash mid-write elsewhere
    second = make_engine(prefix_kv_cache=True, prefix_kv_cache_dir=str(tmp_path))
    assert not second.prefix_from_cache
    np.testing.assert_array_equal(_prefix_blocks(second), _prefix_blocks(first))
    third = make_engine(prefix_kv_cache=True, prefix_kv_cache_dir=str(tmp_path))
    assert third.prefix_from_cache                         # the prefill rewrote it
    assert _answer(third) == _answer(first)


def test_off_writes_nothing(make_engine, tmp_path):
    engine = make_engine(prefix_kv_cache=False, prefix_kv_cache_dir=str(tmp_path))
    assert not engine.prefix_from_cache and not list(tmp_path.iterdir())
