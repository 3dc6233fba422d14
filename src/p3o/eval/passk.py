"""The unbiased pass@k estimator (Chen et al. 2021, "Evaluating Large Language Models Trained on Code").

With n samples per problem of which c are correct, the probability that at least one of k samples drawn
without replacement is correct is

    pass@k = 1 − C(n − c, k) / C(n, k) = 1 − ∏_{i = n−c+1}^{n} (1 − k / i)

The product form never forms a binomial coefficient, so it is exact in float64 for any n.

    pass_at_k([8, 8], [0, 3], 2)   # -> array([0.0, 0.6428...])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray


def pass_at_k(n: ArrayLike, c: ArrayLike, k: int) -> NDArray[np.float64]:
    """Per-problem unbiased pass@k, vectorised over problems.

    Args:
        n: (P,) int, samples drawn for each problem (n ≥ k; may differ between problems).
        c: (P,) int, how many of them were correct (0 ≤ c ≤ n).
        k: the number of attempts, k ≥ 1.

    Returns:
        (P,) float64 in [0, 1]: 1 − ∏_{i=n−c+1}^{n} (1 − k/i), and exactly 1 where n − c < k.
        Computed as 1 − exp(Σ log1p(−k/i)) over a (P, max n) grid masked to the product's range.
    """
    n_arr = np.atleast_1d(np.asarray(n, dtype=np.int64))
    c_arr = np.atleast_1d(np.asarray(c, dtype=np.int64))
    if n_arr.shape != c_arr.shape:
        raise ValueError(f"pass_at_k: n and c must have the same shape, got {n_arr.shape} and {c_arr.shape}")
    if k < 1:
        raise ValueError(f"pass_at_k: k must be ≥ 1, got {k}")
    if n_arr.size == 0:
        return np.zeros(0, dtype=np.float64)
    if (c_arr < 0).any() or (c_arr > n_arr).any():
        raise ValueError("pass_at_k: every c must satisfy 0 ≤ c ≤ n")
    if (n_arr < k).any():
        raise ValueError(f"pass_at_k: k={k} exceeds the number of samples n={int(n_arr.min())} of some problem")
    i = np.arange(1, int(n_arr.max()) + 1, dtype=np.float64)[None, :]  # (1, max n)
    in_product = (i > (n_arr - c_arr)[:, None]) & (i <= n_arr[:, None])  # (P, max n)
    # Inside the product i > n − c ≥ k, so 1 − k/i ∈ (0, 1); elsewhere the factor is 1 (log 0).
    logs = np.where(in_product, np.log1p(-k / np.maximum(i, k + 1.0)), 0.0)
    out = 1.0 - np.exp(logs.sum(axis=1))
    return np.where(n_arr - c_arr < k, 1.0, out)


def mean_pass_at_k(n: ArrayLike, c: ArrayLike, ks: Sequence[int]) -> dict[int, float]:
    """pass@k averaged over problems for each k in `ks` (k larger than the smallest n is skipped)."""
    n_arr = np.atleast_1d(np.asarray(n, dtype=np.int64))
    out: dict[int, float] = {}
    for k in ks:
        if n_arr.size and k <= int(n_arr.min()):
            out[int(k)] = float(pass_at_k(n_arr, c, int(k)).mean())
    return out
