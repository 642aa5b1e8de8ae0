"""A linear-Gaussian view whose noise is small in one direction is not certified as if that direction
were absent.

``O = A z + B ζ`` with ``B = diag(1, 1e-10)`` and ``A = (1, 1e-8)ᵀ``: the exact squared sensitivity is
``1² + (1e-8/1e-10)² = 1 + 1e4`` (B is invertible: closed form ``aᵀ(BBᵀ)⁻¹a``).  With the rank cut at
1e-9 of the top singular value the small-noise direction was dropped, and because A's component
there (1e-8 of its norm) was below the range tolerance it did not count as outside range(B) either:
the view was certified at Δ² = 1, ten thousand times too small.
"""

from __future__ import annotations

import numpy as np
import pytest

from hushnet.privacy.linear_gaussian import LinearGaussianView


@pytest.mark.parametrize("small", [1e-10, 1e-11])
def test_small_but_present_noise_direction_counts(small):
    B = np.diag([1.0, small])
    A = np.array([[1.0], [1e-8]])
    exact = float(A[:, 0] @ np.linalg.solve(B @ B.T, A[:, 0]))
    got = float(LinearGaussianView(A, B).sensitivity_sq(np.ones((1, 1)))[0])
    assert got >= exact * (1 - 1e-9), (got, exact)


def test_direction_absent_from_the_noise_is_infinite():
    """A mean shift along a direction with no noise at all separates the inputs: Δ² = ∞."""
    B = np.diag([1.0, 0.0])
    A = np.array([[1.0], [1e-8]])
    assert LinearGaussianView(A, B).sensitivity_sq(np.ones((1, 1)))[0] == np.inf
