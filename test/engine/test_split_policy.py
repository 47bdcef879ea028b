"""SplitPolicy: measure each way once, then the faster, with a retry of the other every N steps."""
from edge_slm_node.engine.split_policy import SplitPolicy


def run(policy, sequences, seconds_split, seconds_batch, steps):
    choices = []
    for _ in range(steps):
        split = policy.choose(sequences)
        policy.record(sequences, split, seconds_split if split else seconds_batch)
        choices.append(split)
    return choices


def test_measures_both_then_keeps_the_faster_and_retries_the_other():
    policy = SplitPolicy(explore_every=8)
    choices = run(policy, 4, 0.020, 0.026, 24)
    assert choices[:2] == [True, False]
    assert choices[2:].count(False) == 2 and choices[8] is False and choices[16] is False
    assert policy.average(4, True) == 0.020


def test_follows_a_change_of_load_and_keeps_sizes_apart():
    policy = SplitPolicy(explore_every=4, weight=0.5)
    run(policy, 4, 0.020, 0.026, 8)
    assert run(policy, 2, 0.030, 0.017, 8)[2:].count(True) == 1      # 2 sessions: one batch wins
    later = run(policy, 4, 0.040, 0.027, 24)                         # another process now busy
    assert later[-8:].count(False) >= 6
    assert policy.average(4, False) < policy.average(4, True)


def test_forced_choice_is_not_counted():
    policy = SplitPolicy()
    policy.forced = False
    assert run(policy, 3, 0.01, 0.02, 5) == [False] * 5
    policy.forced = None
    assert policy.choose(3) is True
