"""The one interval helper (``reference.intervals``)."""

from reference.intervals import merge, subtract, total


def test_merge_joins_overlapping_and_touching_runs_and_drops_empty_ones() -> None:
    assert merge([(10, 20), (0, 5), (5, 8), (15, 30), (40, 40)]) == [(0, 8), (10, 30)]
    assert merge([[3, 4], [1, 2]]) == [(1, 2), (3, 4)]  # lists from JSON too


def test_subtract_and_total() -> None:
    assert subtract([(0, 10), (20, 30)], [(2, 4), (8, 22)]) == [(0, 2), (4, 8), (22, 30)]
    assert subtract([(0, 10)], []) == [(0, 10)] and subtract([(0, 10)], [(0, 10)]) == []
    assert total([(0, 2), (4, 8)]) == 6
