"""guard_zones: canaries after every activation buffer and every KV tile; a kernel writing past
one ends the step's requests with an error naming the buffer and the step, and stops the engine."""
import numpy as np
import pytest
from numba import njit

from edge_slm_node.engine.guard_check import GUARD_SWEEP_STEPS, GuardZoneError
from edge_slm_node.engine.sampling import SamplingParams
from edge_slm_node.kernels.kv_write import _write_row

PARAMS = SamplingParams(max_new_tokens=4, ignore_eos=True)


@njit
def fill_past_end(flat, count):
    """A buggy kernel: writes count values into flat, which numba does not bounds-check."""
    for i in range(count):
        flat[i] = 1.0


@njit
def write_one_row_too_far(cache, block, h, row, bits):
    """A buggy KV write: offset block_size, the row after the block."""
    _write_row(row, cache, block, cache.shape[1], h, row, bits)


def test_every_buffer_and_kv_tile_is_guarded_and_a_clean_run_breaks_none(make_engine):
    engine = make_engine()
    assert engine.guards.count >= 12                     # activations, logits, norms, scratch, attention work
    assert engine.arena.storage.shape[4] == engine.arena.block_size + 1
    request = engine.submit("a", "What is G01?", PARAMS, create_if_missing=True)
    while not request.done:
        engine.step()
    assert request.finish_reason.value == "length"
    assert engine.guards.breaches() == [] and engine.arena.guard_breaches() == []


def test_a_write_past_an_activation_buffer_stops_with_its_name(make_engine):
    engine = make_engine()
    request = engine.submit("a", "What is G01?", PARAMS, create_if_missing=True)
    engine.step()
    hidden = engine.runner.transformer.buffers.hidden
    fill_past_end(hidden.reshape(-1), hidden.size + 3)
    with pytest.raises(GuardZoneError, match=r"step 2, .*activations\.hidden"):
        engine.step()
    assert request.done and request.finish_reason.value == "error" and "activations.hidden" in request.error
    engine.submit("b", "Hi", PARAMS, create_if_missing=True)
    with pytest.raises(GuardZoneError):                  # it stays stopped
        engine.step()


def test_a_write_past_the_kv_block_a_step_writes_names_the_block(make_engine):
    engine = make_engine()
    request = engine.submit("a", "What is G01?", PARAMS, create_if_missing=True)
    engine.step()
    while engine.kv.num_tokens("a") % engine.config.block_size == 0:    # the next write would open a new block
        engine.step()
    block = engine.kv.block_table("a")[engine.kv.num_tokens("a") // engine.config.block_size]   # the next write's
    head_dim = engine.arena.data.shape[-1]
    write_one_row_too_far(engine.arena.data[3, 1], block, 1, np.ones(head_dim, np.float32), np.zeros(8, np.uint16))
    with pytest.raises(GuardZoneError, match=rf"KV block {block} \(layer 3, V, kv head 1\)"):
        engine.step()
    assert request.finish_reason.value == "error"


def test_a_stray_write_into_any_kv_guard_is_found_by_the_periodic_sweep(make_engine):
    engine = make_engine()
    engine.submit("a", "What is G01?", SamplingParams(max_new_tokens=200, ignore_eos=True), create_if_missing=True)
    engine.step()
    stray = engine.arena.num_blocks - 1                  # a block no one uses
    head_dim = engine.arena.data.shape[-1]
    write_one_row_too_far(engine.arena.data[0, 0], stray, 0, np.ones(head_dim, np.float32), np.zeros(8, np.uint16))
    with pytest.raises(GuardZoneError, match=rf"KV block {stray} "):
        for _ in range(GUARD_SWEEP_STEPS):
            engine.step()
