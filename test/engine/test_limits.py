"""What a client may hold and take: stop strings, queued bytes, queue share, owner keys, session slots."""
import pytest

from edge_slm_node.engine.engine import UnknownSessionError
from edge_slm_node.engine.sampling import InvalidRequestError, SamplingParams
from edge_slm_node.engine.session import SessionOwnershipError


def test_stop_strings_are_bounded_in_length_and_total(make_engine):
    engine = make_engine()
    for stop, message in [(("y" * 257,), "257 characters, at most 256"), (("z" * 256,) * 5, "1280 characters"),
                          (("a",) * 17, "at most 16 stop strings")]:
        with pytest.raises(InvalidRequestError, match=message):
            engine.submit("s", "hello", SamplingParams(stop=stop), create_if_missing=True)
    assert engine.submit("s", "hello", SamplingParams(stop=("z" * 256,) * 4), create_if_missing=True)
    assert list(engine.sessions) == ["s"]


def test_queued_bytes_have_a_budget(make_engine):
    engine = make_engine(max_queued_bytes=2**16, max_input_chars=30000)
    engine.submit("a", "x" * 30000, SamplingParams(), create_if_missing=True)
    engine.submit("b", "x" * 30000, SamplingParams(), create_if_missing=True)
    with pytest.raises(InvalidRequestError, match="max_queued_bytes=65536"):
        engine.submit("c", "x" * 30000, SamplingParams(), create_if_missing=True)
    assert "c" not in engine.sessions


def test_anonymous_commands_leave_a_quarter_of_the_queue_to_owned_sessions(make_engine):
    engine = make_engine(max_queued_requests=8, max_sessions=64)
    engine.create_session("operator", owner_key="k")
    for index in range(6):
        engine.submit(f"anon-{index}", "hello", SamplingParams(), create_if_missing=True)
    with pytest.raises(InvalidRequestError, match="queue full for sessions without an owner_key"):
        engine.submit("anon-6", "hello", SamplingParams(), create_if_missing=True)
    engine.submit("operator", "hello", SamplingParams(), owner_key="k")
    engine.submit("operator", "and?", SamplingParams(), owner_key="k")
    with pytest.raises(InvalidRequestError, match="queue full"):
        engine.submit("operator", "more", SamplingParams(), owner_key="k")


def test_owner_key_guards_every_call(make_engine):
    engine = make_engine()
    engine.create_session("mine", owner_key="secret")
    for call in (lambda: engine.submit("mine", "hi", SamplingParams()), lambda: engine.cancel("mine", "nope"),
                 lambda: engine.reset_session("mine"), lambda: engine.destroy_session("mine", "nope")):
        with pytest.raises(SessionOwnershipError):
            call()
    assert engine.destroy_session("mine", "secret") == 0
    with pytest.raises(UnknownSessionError):
        engine.destroy_session("mine", "secret")


def test_a_command_creating_a_session_makes_its_key_the_owner(make_engine):
    engine = make_engine()
    engine.submit("auto", "hi", SamplingParams(max_new_tokens=1), create_if_missing=True, owner_key="k2")
    assert engine.sessions["auto"].owner_key == "k2" and engine.sessions["auto"].auto_created
    with pytest.raises(SessionOwnershipError):
        engine.submit("auto", "again", SamplingParams(), create_if_missing=True)


def test_eviction_takes_the_cheapest_idle_session_and_never_an_owned_one_for_anonymous(make_engine):
    engine = make_engine(max_sessions=3)
    engine.create_session("owned", owner_key="k")
    engine.create_session("used")
    engine.sessions["used"].messages.append({"role": "user", "content": "x"})
    engine.create_session("empty")
    engine.create_session("new-1")                         # evicts the unused, unowned one
    assert sorted(engine.sessions) == ["new-1", "owned", "used"] and engine.stats().sessions_evicted == 1
    engine.create_session("new-2")                         # unused again before used
    assert sorted(engine.sessions) == ["new-2", "owned", "used"] and engine.stats().sessions_evicted == 2
    engine.submit("used", "busy", SamplingParams())
    engine.submit("new-2", "busy", SamplingParams())
    with pytest.raises(InvalidRequestError, match="owned ones are kept"):
        engine.create_session("anonymous")
    engine.create_session("another-owner", owner_key="k9")  # an owned session may take an owned one
    assert "owned" not in engine.sessions
