"""pass@k against brute-force enumeration of every k-subset, plus edge cases and numerical stability."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from p3o.eval.passk import mean_pass_at_k, pass_at_k


def brute_force(n: int, c: int, k: int) -> float:
    """Fraction of the C(n, k) subsets of k samples that contain at least one of the c correct ones."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    hits = sum(any(samples[i] for i in s) for s in subsets)
    return hits / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_matches_enumeration_over_all_subsets(n: int) -> None:
    for k in range(1, n + 1):
        cs = np.arange(n + 1)
        got = pass_at_k(np.full(n + 1, n), cs, k)
        want = [brute_force(n, int(c), k) for c in cs]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_vectorised_over_problems_with_different_n() -> None:
    n = np.array([3, 8, 5, 6, 4])
    c = np.array([1, 2, 0, 6, 3])
    got = pass_at_k(n, c, 3)
    want = [brute_force(int(a), int(b), 3) for a, b in zip(n, c)]
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_hand_values() -> None:
    # n=8, c=3, k=2: 1 − C(5,2)/C(8,2) = 1 − 10/28 = 0.642857...
    assert pass_at_k([8], [3], 2)[0] == pytest.approx(1 - 10 / 28, abs=1e-12)
    # k = 1 is the plain fraction correct c/n
    np.testing.assert_allclose(pass_at_k([10, 10, 10], [0, 4, 10], 1), [0.0, 0.4, 1.0], atol=1e-12)
    # n − c < k → certain success
    assert pass_at_k([4], [2], 3)[0] == 1.0


def test_stable_for_large_n() -> None:
    # Exact rational value vs the float product form at a size where C(n, k) overflows float64.
    n, c, k = 2000, 37, 500
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert math.comb(n, k) > 1e308
    assert pass_at_k([n], [c], k)[0] == pytest.approx(float(exact), rel=1e-10)


def test_mean_pass_at_k_skips_k_above_n() -> None:
    out = mean_pass_at_k([4, 4], [1, 0], [1, 2, 8])
    assert set(out) == {1, 2}
    assert out[1] == pytest.approx((0.25 + 0.0) / 2)
    assert out[2] == pytest.approx((brute_force(4, 1, 2) + 0.0) / 2)


@pytest.mark.parametrize(
    ("n", "c", "k", "match"),
    [([4], [5], 1, "0 ≤ c ≤ n"), ([4], [-1], 1, "0 ≤ c ≤ n"), ([4], [1], 0, "k must be"), ([2], [1], 3, "exceeds")],
)
def test_bad_input(n: list[int], c: list[int], k: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)


def test_empty() -> None:
    assert pass_at_k([], [], 1).shape == (0,)
