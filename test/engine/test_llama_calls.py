"""engine/llama_calls.py: the llama.cpp call each of a session's positions belongs to."""
from edge_slm_node.engine.llama_calls import DECODED, LLAMA_CPP_UBATCH, ComputedCalls, call_shape


def test_a_prompt_is_one_call_in_micro_batches():
    assert call_shape(0, 5) == (0, 5)
    assert call_shape(4, 5) == (4, 5)
    n = LLAMA_CPP_UBATCH + 3
    assert call_shape(LLAMA_CPP_UBATCH - 1, n) == (LLAMA_CPP_UBATCH - 1, LLAMA_CPP_UBATCH)
    assert call_shape(LLAMA_CPP_UBATCH + 1, n) == (1, 3)


def test_positions_outside_every_prompt_call_were_decoded():
    calls = ComputedCalls()
    calls.record(0, 20)                 # the shared system prompt
    calls.record(20, 30)                # the first turn's new tokens
    assert calls.shape(19) == (19, 20)
    assert calls.shape(25) == (5, 10)
    assert calls.shape(30) == DECODED   # the first generated token
    assert calls.shapes(28, 4) == ([8, 9, 0, 0], [10, 10, 1, 1])


def test_truncation_forgets_what_will_be_computed_anew():
    calls = ComputedCalls()
    calls.record(0, 20)
    calls.record(20, 30)                # turn 1; decoded 30..39
    calls.truncate(20)                  # no history kept: back to the system prompt
    assert len(calls) == 1
    calls.record(20, 26)                # turn 2; decoded from 26
    assert calls.shape(24) == (4, 6)
    assert calls.shape(28) == DECODED   # turn 1 covered it, turn 2 decoded it
    calls.truncate(10)                  # a cut inside a call keeps its shape for what stays
    assert calls.shape(5) == (5, 20) and calls.shape(15) == DECODED


def test_a_resume_repeats_the_shapes_of_the_first_computation():
    """A preempted turn recomputes prompt and generated tokens: nothing is recorded again, so
    each position keeps the call it first had."""
    calls = ComputedCalls()
    calls.record(0, 12)
    before = calls.shapes(0, 18)
    assert calls.shapes(0, 18) == before
    assert before[1] == [12] * 12 + [1] * 6
