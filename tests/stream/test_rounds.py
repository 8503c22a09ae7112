"""The one rule the stream wing decides by repeated runs (placer.stream.rounds)."""

from __future__ import annotations

from placer.stream import rounds
from placer.stream.rounds import MIN_GAIN, REPEATS, SIGN_LEVEL


def test_a_gain_within_min_gain_never_wins():
    assert not rounds.beats([104.0, 104.0, 104.0], [100.0, 100.0, 100.0])
    assert rounds.faster(100 * (1 + MIN_GAIN) + 0.01, 100.0) and not rounds.faster(100 * (1 + MIN_GAIN), 100.0)


def test_runs_apart_win_and_overlapping_runs_need_enough_rounds_won():
    assert rounds.beats([120.0, 121.0, 119.0], [100.0, 101.0, 99.0])  # slowest beats fastest
    # overlapping ranges: 3 of 3 rounds won is a clean sweep (1/8), 2 of 3 is not
    assert rounds.beats([130.0, 110.0, 125.0], [100.0, 115.0, 100.0], pairs=[(130, 100), (116, 115), (125, 100)])
    assert not rounds.beats([130.0, 110.0, 125.0], [100.0, 115.0, 100.0])
    assert SIGN_LEVEL == 0.5 ** REPEATS


def test_fewer_rounds_than_repeats_never_decide_on_pairs():
    assert not rounds.beats([130.0, 110.0], [100.0, 115.0], pairs=[(130, 100), (116, 115)])


def test_centres_may_be_given_for_rates_ranked_otherwise_than_by_their_median():
    assert not rounds.beats([130.0, 131.0], [100.0, 101.0], centres=(100.0, 100.0))


def test_runs_pair_with_the_round_they_ran_in():
    # the incumbent runs first in each round: each run pairs with the incumbent's last run started before it
    assert rounds.paired([5.0, 6.0], [1.5, 2.5], [1.0, 2.0], [1.0, 2.0]) == [(5.0, 1.0), (6.0, 2.0)]
    assert rounds.paired([5.0, 6.0], [], [1.0, 2.0], []) == [(5.0, 1.0), (6.0, 2.0)]  # no times: in order


def test_interleave_runs_each_name_once_a_round_in_the_order_asked():
    ran: list[str] = []
    begun = rounds.interleave(["a", "b", "c"], ran.append, 3, order=rounds.rotated)
    assert begun == 3 and ran == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_interleave_skips_runs_that_do_not_fit_and_stops_when_asked():
    ran: list[str] = []
    begun = rounds.interleave(["a", "b"], ran.append, 5, fits=lambda r, k: k != "b" or r == 0,
                              more=lambda r: r < 2)
    assert begun == 2 and ran == ["a", "b", "a"]


def test_spreads():
    assert rounds.spread([100.0]) == 0.0
    assert rounds.spread([90.0, 100.0, 110.0]) == 0.2
    assert rounds.ratio_spread([200.0, 300.0], [100.0, 100.0]) == 0.4
    assert rounds.ratio_spread([200.0, 0.0], [100.0, 100.0]) == 0.0
