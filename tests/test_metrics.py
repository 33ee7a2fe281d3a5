import numpy as np
import pytest

from trtforge import metrics


def test_identical_arrays():
    a = np.random.default_rng(0).normal(size=(4, 8))
    m = metrics.compare(a, a.copy(), logits=True)
    assert m["rel_l2"] == 0 and m["max_abs"] == 0
    assert m["cosine"] == pytest.approx(1.0) and m["top1_agreement"] == 1.0


def test_known_values():
    a = np.array([[3.0, 4.0]])
    b = np.array([[3.0, 4.5]])
    assert metrics.rel_l2(a, b) == pytest.approx(0.5 / 5.0)
    assert metrics.max_abs(a, b) == pytest.approx(0.5)
    assert metrics.cosine([1, 0], [0, 1]) == pytest.approx(0.0)
    assert metrics.top1_agreement([[1, 2], [2, 1]], [[1, 2], [1, 2]]) == 0.5


def test_rowwise_cosine_exposes_one_bad_row():
    a = np.ones((10, 4))
    b = a.copy()
    b[3] = -1
    rows = metrics.rowwise_cosine(a, b)
    assert rows.min() == pytest.approx(-1.0) and np.sum(rows > 0.999) == 9


def test_shape_mismatch_raises():
    with pytest.raises(ValueError):
        metrics.compare(np.zeros((2, 3)), np.zeros((3, 2)))
