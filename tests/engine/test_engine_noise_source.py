"""Where a node's randomness comes from: secret by default, the public seed only on request."""

from __future__ import annotations

import numpy as np
import pytest

from hushnet.engine.rng import node_generator
from hushnet.runs.spec import Budget, RunSpec, SpecError, parse_spec_toml

BASE = dict(
    protocol="rw-dpsgd",
    task="logreg",
    graph="ring:6",
    steps=10,
    seed=3,
    budget=Budget(10.0, 1e-5),
    sigma=1.0,
)


def test_default_noise_is_secret_and_unpredictable_from_the_seed():
    spec = RunSpec(**BASE)
    assert spec.noise == "secret"
    a, b = spec.node_rng(2, 6).standard_normal(8), spec.node_rng(2, 6).standard_normal(8)
    seeded = node_generator(3, 6, 2).standard_normal(8)
    assert not np.allclose(a, b) and not np.allclose(a, seeded)
    assert spec.noise_label().startswith("secret")


def test_public_seed_noise_is_reproducible_and_labelled_not_private():
    spec = RunSpec(**BASE, noise="public-seed")
    np.testing.assert_array_equal(
        spec.node_rng(2, 6).standard_normal(8), node_generator(3, 6, 2).standard_normal(8)
    )
    assert "NOT private" in spec.noise_label()


def test_noise_field_is_signed_only_when_not_default_and_validated():
    plain, public = (
        RunSpec(**BASE).with_run_id(),
        RunSpec(**BASE, noise="public-seed").with_run_id(),
    )
    assert b"noise" not in plain.canonical_bytes() and b"public-seed" in public.canonical_bytes()
    assert plain.run_id != public.run_id
    with pytest.raises(SpecError, match="noise"):
        RunSpec(**BASE, noise="zero").validate()
    toml = """[run]\nprotocol = "rw-dpsgd"\ngraph = "ring:6"\nsteps = 10\nseed = 3\nsigma = 1.0\nnoise = "public-seed"\n
[task]\nname = "logreg"\n[budget]\nepsilon = 10.0\ndelta = 1e-5\n"""
    assert parse_spec_toml(toml, validate=False).noise == "public-seed"
