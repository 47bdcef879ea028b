"""SplitPolicy: measure both ways, then the faster by median, with a retry of the other every N steps."""
from edge_slm_node.engine.split_policy import SplitPolicy


def run(policy, sequences, seconds_split, seconds_batch, steps, outlier_at=None):
    choices = []
    for step in range(steps):
        split = policy.choose(sequences)
        seconds = seconds_split if split else seconds_batch
        policy.record(sequences, split, seconds * (10 if step == outlier_at else 1))
        choices.append(split)
    return choices


def test_measures_both_then_keeps_the_faster_and_retries_the_other():
    policy = SplitPolicy(warmup=3, explore_every=8)
    choices = run(policy, 4, 0.020, 0.026, 32, outlier_at=0)      # the very first split step was slow
    assert choices[:6] == [True, False] * 3
    later = choices[6:]
    assert later.count(False) == 3 and all(choices[i] is False for i in (8, 16, 24))
    assert policy.estimate(4, True) == 0.020


def test_follows_a_change_of_load_and_keeps_sizes_apart():
    policy = SplitPolicy(window=3, warmup=1, explore_every=4)
    run(policy, 4, 0.020, 0.026, 8)
    assert run(policy, 2, 0.030, 0.017, 10)[2:].count(True) == 2     # 2 sessions: one batch wins
    later = run(policy, 4, 0.040, 0.027, 32)                         # another process now busy
    assert later[-12:].count(False) >= 9
    assert policy.estimate(4, False) < policy.estimate(4, True)


def test_forced_choice_is_not_counted():
    policy = SplitPolicy()
    policy.forced = False
    assert run(policy, 3, 0.01, 0.02, 5) == [False] * 5
    policy.forced = None
    assert policy.choose(3) is True
