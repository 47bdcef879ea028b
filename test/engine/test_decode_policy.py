"""DecodePolicy: measure the candidate modes, run the fastest by median, re-measure the others ever more rarely."""
from edge_slm_node.engine.decode_policy import DecodePolicy, DecodeThreading

SPLIT, ONE, POOL, TEAM = DecodeThreading.SPLIT, DecodeThreading.ONE_THREAD, DecodeThreading.POOL, DecodeThreading.TEAM


def run(policy, sequences, seconds, steps, outlier_at=None, can_split=True, can_pool=False, can_team=False):
    """seconds: mode -> step time; -> the modes chosen."""
    choices = []
    for step in range(steps):
        mode = policy.choose(sequences, can_split, can_pool, can_team)
        policy.record(sequences, mode, seconds[mode] * (10 if step == outlier_at else 1))
        choices.append(mode)
    return choices


def trial_starts(choices, best):
    return [i for i, mode in enumerate(choices) if mode is not best and (i == 0 or choices[i - 1] is not mode)]


def test_candidates():
    assert DecodePolicy.modes(4, can_split=True) == (SPLIT, ONE)
    assert DecodePolicy.modes(1, can_split=True) == (ONE,)
    assert DecodePolicy.modes(4, can_split=False) == (ONE,)                          # num_threads 1
    assert DecodePolicy.modes(1, can_split=True, can_pool=True) == (POOL, ONE)
    assert DecodePolicy.modes(3, can_split=True, can_pool=True) == (SPLIT, POOL, ONE)
    assert DecodePolicy.modes(1, can_split=True, can_pool=True, can_team=True) == (TEAM, POOL, ONE)
    assert DecodePolicy.modes(3, can_split=True, can_pool=True, can_team=True) == (SPLIT, TEAM, POOL, ONE)


def test_one_sequence_picks_a_team_where_it_is_faster_and_leaves_it_when_a_core_gets_busy():
    policy = DecodePolicy(trials=3, explore_every=8)
    choices = run(policy, 1, {TEAM: 0.034, POOL: 0.055, ONE: 0.061}, 100, can_pool=True, can_team=True)
    assert choices[0] is TEAM and choices[-40:].count(TEAM) >= 34
    later = run(policy, 1, {TEAM: 0.120, POOL: 0.080, ONE: 0.065}, 80, can_pool=True, can_team=True)
    assert later[-20:].count(ONE) >= 17


def test_returns_to_the_team_soon_after_a_long_busy_spell():
    policy = DecodePolicy()
    run(policy, 1, {TEAM: 0.040, POOL: 0.060, ONE: 0.068}, 50, can_pool=True, can_team=True)
    busy = run(policy, 1, {TEAM: 0.100, POOL: 0.090, ONE: 0.068}, 600, can_pool=True, can_team=True)
    assert busy[-100:].count(ONE) >= 90
    after = run(policy, 1, {TEAM: 0.040, POOL: 0.060, ONE: 0.068}, 160, can_pool=True, can_team=True)
    back = after.index(TEAM)
    assert back <= 3 * 32           # the others are re-tried every <= 32 steps (here the pool first, then the team)
    assert after[back + 8:].count(TEAM) >= 0.9 * len(after[back + 8:])


def test_one_sequence_picks_the_pool_where_it_is_faster_and_keeps_checking():
    policy = DecodePolicy(trials=3, explore_every=8)
    choices = run(policy, 1, {POOL: 0.012, ONE: 0.013}, 100, can_pool=True)
    assert choices[:2] == [POOL, ONE]
    assert choices[-40:].count(POOL) >= 34 and ONE in choices[-60:]     # re-measured, ever more rarely
    later = run(policy, 1, {POOL: 0.030, ONE: 0.013}, 60, can_pool=True)  # the other core got busy
    assert later[-20:].count(ONE) >= 17


def test_close_ways_get_full_trials_then_the_fastest_runs_and_trials_grow_rarer():
    policy = DecodePolicy(trials=3, explore_every=8, max_explore_every=32)
    choices = run(policy, 4, {SPLIT: 0.020, ONE: 0.023}, 200)
    assert choices[:8] == [SPLIT, ONE] + [SPLIT] * 3 + [ONE] * 3       # one each, then a trial of each
    later = choices[8:]
    starts = trial_starts(later, SPLIT)
    assert all(later[i:i + 3] == [ONE] * 3 for i in starts)             # 1.15x slower: whole trials
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert starts[0] == 7 and gaps[0] == 2 + 16 and set(gaps[1:]) == {2 + 32}   # doubling up to the cap
    assert policy.estimate(4, SPLIT) == 0.020


def test_a_clearly_slower_way_costs_one_step_per_trial():
    policy = DecodePolicy(trials=3, explore_every=8)
    choices = run(policy, 4, {SPLIT: 0.016, ONE: 0.025}, 100)
    assert choices[:5] == [SPLIT, ONE, SPLIT, SPLIT, SPLIT]          # ONE is not given a trial
    assert choices.count(ONE) == 1 + len(trial_starts(choices[5:], SPLIT))
    assert all(choices[i + 1] is SPLIT for i, mode in enumerate(choices[:-1]) if mode is ONE)


def test_a_slow_first_step_does_not_decide():
    policy = DecodePolicy(trials=3, explore_every=8)
    choices = run(policy, 4, {SPLIT: 0.016, ONE: 0.025}, 48, outlier_at=0)   # split's first step 10x slow
    assert choices[1:5] == [ONE] * 4                # meanwhile one thread looks best...
    assert choices[-24:].count(SPLIT) >= 22         # ...until split's first trial: then only 1-step trials of ONE


def test_follows_a_change_of_load_and_keeps_sizes_apart():
    policy = DecodePolicy(window=3, trials=2, explore_every=8)
    run(policy, 4, {SPLIT: 0.020, ONE: 0.026}, 12)
    assert run(policy, 1, {ONE: 0.013}, 16) == [ONE] * 16
    later = run(policy, 4, {SPLIT: 0.040, ONE: 0.027}, 40)                   # another process now busy
    assert later[-20:].count(ONE) >= 17
    assert policy.estimate(4, ONE) < policy.estimate(4, SPLIT)
    assert policy.estimate(1, SPLIT) is None                                 # one sequence never splits


def test_forced_way_and_single_candidates_skip_the_measuring():
    policy = DecodePolicy()
    policy.forced = ONE
    assert run(policy, 3, {ONE: 0.03, SPLIT: 0.01}, 5) == [ONE] * 5
    policy.forced = SPLIT
    assert policy.choose(1, can_split=True) is ONE                # one sequence cannot split
    policy.forced = POOL
    assert policy.choose(1, can_split=True, can_pool=True) is POOL
    assert policy.choose(1, can_split=False, can_pool=False) is ONE      # one thread: no pool
    policy.forced = TEAM
    assert policy.choose(1, can_split=True, can_team=True) is TEAM
    assert policy.choose(1, can_split=False, can_team=False) is ONE      # no side thread: no team
    policy.forced = None
    assert policy.choose(3, can_split=True) is SPLIT
    assert run(policy, 2, {ONE: 0.01}, 3, can_split=False) == [ONE] * 3
