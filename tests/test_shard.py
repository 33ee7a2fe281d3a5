"""Pure pieces of the Ray scale-out (issue 13): work units and the exactly-once ledger, no Ray needed."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trtforge.scaleout.shard import Ledger, WorkerLost, plan_units, split_evenly, unit_size


def test_units_keep_documents_whole_and_in_order():
    assert plan_units([5, 1, 1, 9, 2, 2], 4) == [[0], [1, 2, 3], [4, 5]]
    assert plan_units([20], 4) == [[0]]  # a long document is its own unit, never split


@given(st.lists(st.integers(1, 40), min_size=1, max_size=60), st.integers(1, 64))
def test_units_cover_every_document_once(counts, size):
    units = plan_units(counts, size)
    assert [d for u in units for d in u] == list(range(len(counts)))
    assert all(sum(counts[d] for d in u) >= size for u in units[:-1])


def test_unit_size_bounds():
    assert unit_size(204, 2, 8) == 26  # about 4 units per worker
    assert unit_size(10, 8, 8) == 8  # at least one batch
    assert unit_size(10**6, 2, 8) == 256  # at most 32 batches


@given(st.integers(0, 200), st.integers(1, 50))
def test_split_evenly(n, parts):
    pieces = split_evenly(n, parts)
    assert [i for r in pieces for i in r] == list(range(n))
    assert not pieces or max(map(len, pieces)) - min(map(len, pieces)) <= 1


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.integers(1, 4), st.randoms(use_true_random=False))
def test_ledger_commits_each_unit_once_whatever_dies(units, workers, rnd):
    """Random schedules where workers die with units in flight: every unit is committed exactly once."""
    ledger = Ledger(units, max_attempts=10)
    alive, next_id, committed, deaths = list(range(workers)), workers, [], 0
    while not ledger.complete:
        for w in alive:
            while sum(1 for x in ledger.inflight.values() if x == w) < 2 and (u := ledger.take(w)) is not None:
                pass
        flying = list(ledger.inflight.items())
        u, w = rnd.choice(flying)
        if deaths < 6 and rnd.random() < 0.2:
            deaths += 1
            lost = ledger.lost(w)
            assert u in lost and all(x not in ledger.inflight for x in lost)
            alive.remove(w)
            alive.append(next_id)  # a replacement
            next_id += 1
        else:
            ledger.finish(u, w)
            committed.append(u)
    assert sorted(committed) == list(range(units))


def test_ledger_refuses_a_second_commit_and_gives_up_on_a_killer_unit():
    ledger = Ledger(2, max_attempts=2)
    u = ledger.take(0)
    ledger.finish(u, 0)
    with pytest.raises(RuntimeError, match="unit 0 finished on worker 0"):
        ledger.finish(u, 0)
    assert ledger.take(1) == 1 and ledger.lost(1) == [1]
    assert ledger.take(2) == 1
    with pytest.raises(WorkerLost, match="unit 1 was lost with its Ray worker 2 times"):
        ledger.lost(2)


def test_affinity_keeps_a_unit_on_its_worker_until_that_worker_dies():
    ledger = Ledger(2, affinity={0: 0, 1: 1})
    assert ledger.take(1) == 1 and ledger.take(1) is None  # unit 0 belongs to worker 0, which lives
    ledger.dead.add(0)
    assert ledger.take(1) == 0


def test_ray_missing_or_unreachable_is_one_sentence(monkeypatch):
    import sys

    from trtforge.core.errors import UserError
    from trtforge.scaleout.pool import _probe, require_ray

    with pytest.raises(UserError, match="no Ray cluster answers at '127.0.0.1:1'"):
        _probe("127.0.0.1:1")
    with pytest.raises(UserError, match="no Ray cluster answers at 'nonsense'"):
        _probe("nonsense")
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(UserError, match=r"pip install 'trtforge\[ray\]'"):
        require_ray()
