"""DecodePolicy: measure every way, then the fastest by median, re-measuring the others ever more rarely."""
from edge_slm_node.engine.decode_policy import DecodePolicy, DecodeWay

SPLIT, ONE, POOL = DecodeWay.SPLIT, DecodeWay.ONE_THREAD, DecodeWay.POOL


def run(policy, sequences, seconds, steps, outlier_at=None, can_split=True):
    """seconds: way -> step time; -> the ways chosen."""
    choices = []
    for step in range(steps):
        way = policy.choose(sequences, can_split)
        policy.record(sequences, way, seconds[way] * (10 if step == outlier_at else 1))
        choices.append(way)
    return choices


def test_measures_every_way_then_keeps_the_fastest_and_explores_ever_more_rarely():
    policy = DecodePolicy(warmup=3, explore_every=8, max_explore_every=32)
    choices = run(policy, 4, {SPLIT: 0.020, ONE: 0.026, POOL: 0.030}, 200, outlier_at=0)  # first split step slow
    assert choices[:9] == [SPLIT, ONE, POOL] * 3
    explored = [i for i, way in enumerate(choices) if way is not SPLIT and i >= 9]
    starts = [i for i in explored if i - 1 not in explored]
    assert [choices[i] for i in starts[:4]] == [ONE, POOL, ONE, POOL]          # the least recently explored
    assert all(choices[i:i + 3] == [choices[i]] * 3 for i in starts)           # 3 steps in a row each
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert starts[0] == 9 + 7                                # the 8th step after the warm-up
    assert gaps[0] == 2 + 16 and set(gaps[1:]) == {2 + 32}   # interval doubled, then at its cap
    assert policy.estimate(4, SPLIT) == 0.020


def test_follows_a_change_of_load_and_keeps_sizes_apart():
    policy = DecodePolicy(window=3, warmup=1, explore_every=4)
    run(policy, 4, {SPLIT: 0.020, ONE: 0.026, POOL: 0.030}, 12)
    assert run(policy, 1, {ONE: 0.013, POOL: 0.015}, 12, can_split=True)[2:].count(ONE) >= 8
    later = run(policy, 4, {SPLIT: 0.040, ONE: 0.027, POOL: 0.030}, 40)       # another process now busy
    assert later[-20:].count(ONE) >= 17
    assert policy.estimate(4, ONE) < policy.estimate(4, SPLIT)
    assert policy.estimate(1, SPLIT) is None                                    # one sequence never splits


def test_forced_way_is_not_counted_and_falls_back_where_it_cannot_apply():
    policy = DecodePolicy()
    policy.forced = POOL
    assert run(policy, 3, {SPLIT: 0.01, ONE: 0.02, POOL: 0.03}, 5) == [POOL] * 5
    policy.forced = SPLIT
    assert policy.choose(1, can_split=True) is ONE
    assert policy.choose(3, can_split=False) is ONE
    policy.forced = None
    assert policy.choose(3, can_split=True) is SPLIT                            # warm-up starts from step 1
