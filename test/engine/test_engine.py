"""The engine on the real SmolLM2 GGUF: sessions, multi-turn KV reuse, sampling, streaming, errors."""
import numpy as np
import pytest

from edge_slm_node.engine.decode_policy import DecodeThreading
from edge_slm_node.engine.engine import UnknownSessionError
from edge_slm_node.engine.request import FinishReason
from edge_slm_node.engine.sampling import InvalidRequestError, SamplingParams

from conftest import assert_pool_consistent, run_to_completion

GREEDY = SamplingParams(max_new_tokens=12)


def answer(engine, session_id, text, params=GREEDY):
    pieces = list(engine.generate(session_id, text, params))
    return pieces, engine.last_request


def test_generate_then_destroy_returns_every_block(make_engine):
    engine = make_engine()
    baseline = engine.stats()
    engine.create_session("a")
    pieces, request = answer(engine, "a", "What does M03 do?")
    assert request.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
    assert "".join(pieces) == request.text_out and request.text_out.strip()
    assert engine.stats().used_blocks > baseline.used_blocks
    assert engine.destroy_session("a") > 0
    after = engine.stats()
    assert after.used_blocks == baseline.used_blocks
    assert after.free_blocks + after.cached_blocks == baseline.free_blocks + baseline.cached_blocks
    assert_pool_consistent(engine)


def test_greedy_is_deterministic_across_sessions(make_engine):
    engine = make_engine()
    engine.create_session("a")
    engine.create_session("b")
    _, first = answer(engine, "a", "List three G-codes.")
    _, second = answer(engine, "b", "List three G-codes.")
    assert first.generated_ids == second.generated_ids
    assert second.cached_prompt_tokens >= len(engine.prefix_ids) - 1


def test_second_turn_prefills_only_new_tokens(make_engine):
    engine = make_engine()
    engine.create_session("a")
    _, first = answer(engine, "a", "What is G00?")
    _, second = answer(engine, "a", "And G01?")
    assert second.prompt_ids[:len(first.prompt_ids)] == first.prompt_ids
    new_tokens = len(second.prompt_ids) - second.cached_prompt_tokens
    assert second.cached_prompt_tokens >= len(first.prompt_ids)
    assert new_tokens < len(second.prompt_ids) - len(first.prompt_ids) + 1
    assert engine.sessions["a"].messages[0] == {"role": "user", "content": "What is G00?"}


def test_seed_replays_and_differs(make_engine):
    engine = make_engine()
    for name in "abc":
        engine.create_session(name)
    sampled = lambda sid, seed: answer(engine, sid, "Name a machine tool.",
                                       SamplingParams(temperature=1.2, top_k=50, top_p=0.95, seed=seed,
                                                      max_new_tokens=16, ignore_eos=True))[1].generated_ids
    assert sampled("a", 7) == sampled("b", 7)
    assert sampled("c", 8) != sampled("a", 7) or sampled("c", 9) != sampled("a", 7)


# answers whose characters span several tokens: SmolLM2 splits Chinese characters, Qwen2.5 (a
# vocabulary with most of them whole) splits emoji
SPLIT_CHARACTER_PROMPTS = ("请用中文解释数控机床。", "Repeat these emoji five times: 🦩🪐🦄🧿🫧")


def test_streamed_pieces_are_whole_characters(make_engine):
    engine = make_engine()

    def whole(data):
        try:
            data.decode("utf-8")
            return True
        except UnicodeDecodeError:
            return False
    split_tokens = []
    for index, prompt in enumerate(SPLIT_CHARACTER_PROMPTS):
        engine.create_session(f"s{index}")
        pieces, request = answer(engine, f"s{index}", prompt, SamplingParams(max_new_tokens=24, ignore_eos=True))
        assert "".join(pieces) == engine.tokenizer.decode(request.generated_ids)
        # held back until complete; only the flush at max_new_tokens may carry an incomplete tail
        assert all("\ufffd" not in piece for piece in pieces[:-1]), (prompt, pieces)
        split_tokens += [t for t in request.generated_ids if not whole(engine.tokenizer.token_bytes(t))]
    assert split_tokens, "an answer should contain characters split across tokens"


def test_stop_string_cuts_the_answer(make_engine):
    engine = make_engine()
    engine.create_session("a")
    engine.create_session("b")
    _, full = answer(engine, "a", "What is G01?", SamplingParams(max_new_tokens=20, ignore_eos=True))
    text = full.text_out
    stop = text[len(text) // 2: len(text) // 2 + 3]
    _, cut = answer(engine, "b", "What is G01?", SamplingParams(max_new_tokens=20, ignore_eos=True, stop=(stop,)))
    assert cut.finish_reason is FinishReason.STOP
    assert cut.text_out == text[:text.index(stop)]


def test_reset_keeps_system_prompt_and_answers_like_new(make_engine):
    engine = make_engine()
    engine.create_session("a")
    engine.create_session("fresh")
    answer(engine, "a", "What is G00?")
    freed = engine.reset_session("a")
    assert freed > 0
    assert engine.kv.num_tokens("a") == len(engine.prefix_ids)
    assert engine.sessions["a"].messages == []
    _, after_reset = answer(engine, "a", "What is G02?")
    _, new = answer(engine, "fresh", "What is G02?")
    assert after_reset.generated_ids == new.generated_ids


def answers_alone(engine, prompts: dict) -> dict:
    """Each prompt's greedy answer ids in a session of its own; then creates sessions named as the keys."""
    alone = {}
    for sid, text in prompts.items():
        engine.create_session("alone-" + sid)
        alone[sid] = answer(engine, "alone-" + sid, text)[1].generated_ids
    for sid in prompts:
        engine.create_session(sid)
    return alone


@pytest.mark.parametrize("threads", [2, 3])
def test_concurrent_sessions_batched_equal_alone(make_engine, threads):
    engine = make_engine(num_threads=threads)
    prompts = {"a": "What is G01?", "b": "Why does spindle 2 alarm?", "c": "Shut off valve three."}
    alone = answers_alone(engine, prompts)
    split_before = engine.runner.split_steps
    requests = [engine.submit(sid, text, GREEDY) for sid, text in prompts.items()]
    engine.step()                           # the three new prompt parts fit one forward step
    assert all(r.first_token_at is not None for r in requests)
    run_to_completion(engine, requests)
    for request in requests:
        assert request.generated_ids == alone[request.session_id]
    assert engine.runner.split_steps > split_before      # 3 sequences over 2 or 3 threads
    assert_pool_consistent(engine)


def test_every_decode_way_gives_the_same_answers(make_engine):
    """split, a team, one thread and the thread pool, each forced for a whole run."""
    engine = make_engine()
    prompts = {"a": "What is G01?", "b": "Why does spindle 2 alarm?", "c": "Shut off valve three."}
    answers = {}
    for mode in DecodeThreading:
        engine.runner.decode_policy.forced = mode
        sids = [f"{mode.name}-{sid}" for sid in prompts]
        for sid in sids:
            engine.create_session(sid)
        requests = [engine.submit(sid, text, GREEDY) for sid, text in zip(sids, prompts.values())]
        run_to_completion(engine, requests)
        alone = answer(engine, sids[0], "And G02?")[1]           # one session decoding
        answers[mode] = [r.generated_ids for r in requests] + [alone.generated_ids]
    assert answers[DecodeThreading.SPLIT] == answers[DecodeThreading.ONE_THREAD] == answers[DecodeThreading.POOL] \
        == answers[DecodeThreading.TEAM]
    assert engine.runner.split_steps > 0 and engine.runner.team_steps > 0
    assert_pool_consistent(engine)


def test_prompts_sharing_small_forward_steps_answer_as_alone(make_engine):
    """With max_batch_tokens 24, three new prompts (15-20 new tokens each) are cut into chunks that
    share steps with each other and with decoding sessions; every answer is still the one it gets alone."""
    engine = make_engine(max_batch_tokens=24)
    prompts = {"a": "What is G01?", "b": "Why does spindle 2 alarm after the tool change?", "c": "Shut off valve three."}
    alone = answers_alone(engine, prompts)
    requests = [engine.submit(sid, text, GREEDY) for sid, text in prompts.items()]
    engine.step()
    progress = [r.prefill_done - r.cached_prompt_tokens for r in requests]
    assert sum(progress) == 24 and progress[0] > 0 and progress[1] > 0      # two prompts in one step
    run_to_completion(engine, requests)
    for request in requests:
        assert request.generated_ids == alone[request.session_id]
    assert_pool_consistent(engine)


def test_split_decode_failure_ends_both_halves_with_an_error_and_recovers(make_engine):
    engine = make_engine()
    for sid in ("a", "b"):
        engine.create_session(sid)
    side = engine.runner.sides[0].transformer
    good_work = side.attention_work
    side.attention_work = np.zeros((good_work.shape[0], 8), np.float32)     # too small: the kernel refuses
    requests = [engine.submit(sid, "What is G01?", GREEDY) for sid in ("a", "b")]
    run_to_completion(engine, requests)
    for request in requests:
        assert request.finish_reason is FinishReason.ERROR
        assert "forward pass failed" in request.error and "work buffer too small" in request.error
    assert_pool_consistent(engine)
    side.attention_work = good_work
    requests = [engine.submit(sid, "What is G01?", GREEDY) for sid in ("a", "b")]
    run_to_completion(engine, requests)
    assert all(r.finish_reason in (FinishReason.LENGTH, FinishReason.STOP) for r in requests)
    assert requests[0].generated_ids == requests[1].generated_ids
    assert_pool_consistent(engine)


def test_bad_requests_fail_clearly_and_change_nothing(make_engine):
    engine = make_engine(max_context_tokens=64, max_input_chars=2000)
    baseline = engine.stats()
    engine.create_session("a")
    with pytest.raises(InvalidRequestError, match="empty prompt"):
        engine.submit("a", "   ", GREEDY)
    with pytest.raises(InvalidRequestError, match="2001 characters"):
        engine.submit("a", "x" * 2001, GREEDY)
    for bad, match in [(dict(temperature=-1.0), "temperature"), (dict(top_p=0.0), "top_p"),
                       (dict(top_k=-3), "top_k"), (dict(max_new_tokens=0), "max_new_tokens"),
                       (dict(repetition_penalty=0.0), "repetition_penalty"), (dict(stop=("",)), "stop")]:
        with pytest.raises(InvalidRequestError, match=match):
            engine.submit("a", "hello", SamplingParams(**bad))
    with pytest.raises(UnknownSessionError, match="unknown session 'nope'"):
        engine.submit("nope", "hello", GREEDY)
    request = engine.submit("a", "describe the spindle " * 30, GREEDY)
    run_to_completion(engine, [request])
    assert request.finish_reason is FinishReason.ERROR
    assert "context limit is 64" in request.error
    assert engine.destroy_session("a") >= 0
    with pytest.raises(UnknownSessionError):
        engine.destroy_session("a")
    after = engine.stats()
    assert (after.used_blocks, after.free_blocks + after.cached_blocks) == \
        (baseline.used_blocks, baseline.free_blocks + baseline.cached_blocks)
    assert_pool_consistent(engine)
