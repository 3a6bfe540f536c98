"""allocations.units: the unit conversions and the peak sweep, against brute force (hypothesis) and by hand."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from allocations import units
from allocations.placement.mig import mig_compute_milli, profiles_for

T0 = datetime(2026, 1, 31, 20, 0, tzinfo=timezone.utc)
minutes = st.integers(min_value=0, max_value=600)
amounts = st.integers(min_value=1, max_value=1000)
holdings = st.lists(st.tuples(minutes, minutes, amounts).filter(lambda h: h[0] < h[1]), max_size=12)


def at(m: int) -> datetime:
    return T0 + timedelta(minutes=m)


@given(holdings, minutes, minutes)
def test_the_peak_matches_adding_up_every_minute(held, a, b):
    start, end = min(a, b), max(a, b)
    found = units.peak([(at(s), at(e), amount) for s, e, amount in held], at(start), at(end))
    per_minute = [sum(amount for s, e, amount in held if s <= m < e) for m in range(start, end)]
    assert found.amount == max(per_minute, default=0)
    if found.amount:
        assert found.at == at(per_minute.index(found.amount) + start)
    else:
        assert found.at is None


def test_back_to_back_holdings_never_count_together():
    assert units.peak([(at(0), at(60), 1), (at(60), at(120), 1)], at(0), at(120)) == (1, at(0))
    assert units.peak([(0, 10, 600), (10, 20, 600)], 0, 20).amount == 600


def test_only_the_part_inside_the_window_counts():
    assert units.peak([(0, 10, 600), (5, 20, 300)], 0, 20) == (900, 5)
    assert units.peak([(0, 10, 600), (5, 20, 300)], 10, 20) == (300, 10)
    assert units.peak([(0, 10, 600)], 10, 20) == (0, None)


def test_a_mig_instance_is_its_compute_slices_out_of_seven():
    assert [units.mig_milli(g) for g in (1, 2, 3, 4, 7)] == [143, 286, 429, 571, 1000]
    assert mig_compute_milli("3g.40gb") == 429
    assert profiles_for("H100-80GB")["7g.80gb"].milli == units.MILLI_PER_GPU


def test_gpu_equivalents_follow_the_share_and_the_model_weight():
    assert units.ge(units.MILLI_PER_GPU) == 1.0
    assert units.ge(250) == 0.25
    assert units.ge(units.mig_milli(1), weight=2.0) == 0.286
