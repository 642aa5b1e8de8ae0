"""Typed options: every accountant that took a dozen keywords takes one frozen, validated dataclass.

The options are checked once, in ``__post_init__``, with one-line errors; they are immutable (so a
:class:`WalkLossOptions` built once can be shared between the matrix and the pair accountant); the old
keyword form, kept where callers are many, gives the same number as the options form; and an
unknown keyword is a one-line ``TypeError`` that names the accountant and its options.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hushnet.privacy import anonymity, audit, calibration, koskela, muffliato, randomwalk
from hushnet.privacy.api import QueryOptions, make_query, privacy_matrix
from hushnet.privacy.graphs import metropolis_hastings, parse_graph

W = metropolis_hastings(parse_graph("grid:3x4"))


@pytest.mark.parametrize(
    "cls, kwargs, msg",
    [
        (randomwalk.WalkLossOptions, dict(bound="maybe"), "bound must be 'certified' or 'paper'"),
        (randomwalk.WalkLossOptions, dict(horizon="lnT"), "not allowed for bound='certified'"),
        (randomwalk.WalkLossOptions, dict(passage="teleport"), "passage must be one of"),
        (
            randomwalk.WalkLossOptions,
            dict(on_violation="ignore"),
            "on_violation must be 'refuse' or 'clamp'",
        ),
        (randomwalk.WalkLossOptions, dict(max_contributions=0), "max_contributions must be > 0"),
        (muffliato.MuffliatoOptions, dict(view="global"), "view must be one of"),
        (muffliato.MuffliatoOptions, dict(delta=1.5), "delta must be in \\(0, 1\\)"),
        (koskela.StreamOptions, dict(known_noise="all"), "known_noise must be one of"),
        (audit.AuditOptions, dict(n_test=0), "n_test must be >= 1"),
        (calibration.CalibrationOptions, dict(kind="rdp"), "kind='rdp' needs delta"),
        (calibration.CalibrationOptions, dict(sigma_min=2.0), "sigma_min <= sigma_init"),
        (anonymity.Theorem3Options, dict(mode="fast"), "mode must be one of"),
        (QueryOptions, dict(alpha=1.0, sigma=1.0, steps=3), "alpha is a Rényi order"),
    ],
)
def test_bad_options_are_one_line_errors(cls, kwargs, msg) -> None:
    with pytest.raises(ValueError, match=msg) as exc:
        cls(**kwargs)
    assert "\n" not in str(exc.value)


def test_options_are_frozen() -> None:
    o = randomwalk.WalkLossOptions(constraint="proof")
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.bound = "paper"  # type: ignore[misc]


def test_old_keyword_form_equals_options_form() -> None:
    o = randomwalk.WalkLossOptions(constraint="proof", horizon="harmonic", contributions=3.0)
    a = randomwalk.rw_pndp_matrix(W, 80, 2.0, 1.0, o).matrix
    b = randomwalk.rw_pndp_matrix(
        W, 80, 2.0, 1.0, constraint="proof", horizon="harmonic", contributions=3.0
    ).matrix
    np.testing.assert_array_equal(a, b)
    assert randomwalk.rw_pair_loss(W, 0, 7, 80, 2.0, 1.0, o) == pytest.approx(a[0, 7], rel=1e-12)
    # keywords override the options object
    c = randomwalk.rw_pndp_matrix(W, 80, 2.0, 1.0, o, contributions=1.0).matrix
    np.testing.assert_allclose(c * 3.0, a, rtol=1e-12)
    fn = lambda s: randomwalk.rw_pndp_matrix(W, 80, 2.0, s, constraint="proof").matrix  # noqa: E731
    r1 = calibration.calibrate_sigma(fn, 1.0, calibration.CalibrationOptions(kind="dp", rtol=1e-6))
    r2 = calibration.calibrate_sigma(fn, 1.0, kind="dp", rtol=1e-6)
    assert r1.sigma == r2.sigma


def test_unknown_keyword_names_the_accountant() -> None:
    with pytest.raises(
        TypeError, match="rw_pndp_matrix: unknown option\\(s\\) horizn; WalkLossOptions has"
    ):
        randomwalk.rw_pndp_matrix(W, 10, 2.0, 1.0, horizn="exact")
    with pytest.raises(TypeError, match="privacy_matrix: unknown option\\(s\\) stpes"):
        privacy_matrix("grid:3x4", "rw", alpha=2, sigma=1, stpes=3)
    with pytest.raises(TypeError, match="options must be a WalkLossOptions"):
        randomwalk.rw_pndp_matrix(W, 10, 2.0, 1.0, QueryOptions(alpha=2, sigma=1, steps=3))


def test_query_options_build_the_same_query_as_the_keywords() -> None:
    q = make_query("grid:3x4", "muffliato", QueryOptions(alpha=3.0, sigma=1.5, steps=6))
    a = privacy_matrix(q).matrix
    b = privacy_matrix("grid:3x4", "muffliato", alpha=3.0, sigma=1.5, steps=6).matrix
    np.testing.assert_array_equal(a, b)
