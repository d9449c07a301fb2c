"""The audit's rank test against values worked out by hand (scipy is not a dependency)."""

from __future__ import annotations

import math

import pytest

from gateway.tools.cachetest.stats import mann_whitney_less, normal_cdf, ranks


def test_ties_share_the_mean_of_the_ranks_they_span() -> None:
    assert ranks([2.0, 1.0, 2.0, 2.0, 3.0, 3.0]) == [3.0, 1.0, 3.0, 3.0, 5.5, 5.5]


def test_normal_cdf_at_known_points() -> None:
    assert normal_cdf(0.0) == 0.5
    assert normal_cdf(-1.959963984540054) == pytest.approx(0.025, abs=1e-15)
    # Far into the lower tail erfc keeps its precision (1 - Phi(8) would be 0).
    assert normal_cdf(-8.0) == pytest.approx(6.220960574271785e-16, rel=1e-12)


def test_complete_separation_of_three_against_three() -> None:
    """x = 1,2,3 and y = 4,5,6: ranks of x sum to 6, so U_x = 6 - 3*4/2 = 0; mean 9/2;
    variance 3*3/12 * 7 = 5.25; z = (0 - 4.5 + 0.5) / sqrt(5.25) = -1.745743...;
    p = Phi(z) = 0.040428 (scipy's asymptotic "less" gives the same)."""
    test = mann_whitney_less([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert test.u_x == 0.0
    assert test.z == pytest.approx(-4 / math.sqrt(5.25), rel=1e-15)
    assert test.p_value == pytest.approx(0.0404277991850, rel=1e-10)
    assert test.cles == 1.0
    assert test.rank_biserial == 1.0


def test_ties_correct_the_variance() -> None:
    """x = 1,2,2 and y = 2,3,3: ranks 1, 3, 3 | 3, 5.5, 5.5; R_x = 7, U_x = 1. Tie groups of
    3 and 2 give sum(t^3 - t) = 24 + 6 = 30; variance = 9/12 * (7 - 30/30) = 4.5;
    z = (1 - 4.5 + 0.5) / sqrt(4.5) = -sqrt(2); p = Phi(-sqrt(2)) = 0.0786496.
    CLES = 1 - 1/9 = 8/9, rank-biserial = 7/9."""
    test = mann_whitney_less([1.0, 2.0, 2.0], [2.0, 3.0, 3.0])
    assert test.u_x == 1.0
    assert test.z == pytest.approx(-math.sqrt(2), rel=1e-15)
    assert test.p_value == pytest.approx(0.0786496035251, rel=1e-10)
    assert test.cles == pytest.approx(8 / 9, rel=1e-15)
    assert test.rank_biserial == pytest.approx(7 / 9, rel=1e-15)


def test_eight_against_eight_separated() -> None:
    """U_x = 0, mean 32, variance 64/12 * 17 = 90.667, z = -31.5 / 9.5219 = -3.30818."""
    test = mann_whitney_less([float(v) for v in range(1, 9)], [float(v) for v in range(9, 17)])
    assert test.z == pytest.approx(-31.5 / math.sqrt(64 / 12 * 17), rel=1e-15)
    assert test.p_value == pytest.approx(4.6953e-4, rel=1e-3)


def test_x_slower_than_y_is_no_evidence() -> None:
    test = mann_whitney_less([4.0, 5.0, 6.0], [1.0, 2.0, 3.0])
    assert test.u_x == 9.0
    # z = (9 - 4.5 + 0.5) / sqrt(5.25): the continuity correction leans towards no evidence.
    assert test.p_value == pytest.approx(normal_cdf(5 / math.sqrt(5.25)), rel=1e-15)
    assert test.rank_biserial == -1.0


def test_all_equal_values_give_no_evidence() -> None:
    test = mann_whitney_less([1.0, 1.0], [1.0, 1.0, 1.0])
    assert (test.z, test.p_value, test.cles, test.rank_biserial) == (0.0, 1.0, 0.5, 0.0)


def test_a_small_shift_in_a_large_sample_is_significant_but_not_a_large_effect() -> None:
    """x = y - 40 over y = 0..399: x_i is above y_j for j < i - 40, 1 + ... + 359 pairs, and
    ties it 360 times, so U_x = 359*360/2 + 360/2 = 64,800 of 160,000 pairs; CLES = 0.595,
    rank-biserial 0.19: significant at 1%, but far from the audit's minimum effect."""
    y = [float(v) for v in range(400)]
    x = [v - 40 for v in y]
    test = mann_whitney_less(x, y)
    assert test.u_x == 64_800.0
    assert test.cles == pytest.approx(0.595, rel=1e-12)
    assert test.rank_biserial == pytest.approx(0.19, rel=1e-12)
    assert test.p_value < 1e-3
    assert not test.significant(alpha=0.01, min_effect=0.5)
    assert test.significant(alpha=0.01, min_effect=0.1)


def test_empty_samples_are_refused() -> None:
    with pytest.raises(ValueError):
        mann_whitney_less([], [1.0])
