"""Run specs: TOML parsing, validation, ECDSA P-256 signing/verification, tampering, node budget policy."""

import dataclasses

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from hushnet.families.walk.accounting import evaluate_policy, projected_row
from hushnet.runs.spec import (
    Budget,
    SignedRunSpec,
    SpecError,
    SpecSignatureError,
    parse_spec_toml,
    sign_spec,
    verify_spec,
)

SPEC = """
[run]
protocol = "rw-dpsgd"
graph = "hypercube:4"
steps = 400
step_size = 0.05
sigma = 4.0
clip = 0.4
cap = 30
seed = 7
view_model = "sender-known"
on_peer_down = "pause"

[task]
name = "logreg"

[budget]
epsilon = 10.0
delta = 1e-6
"""


@pytest.fixture(scope="module")
def key():
    return ec.generate_private_key(ec.SECP256R1())


def test_parse_and_machine_params():
    s = parse_spec_toml(SPEC)
    assert s.protocol == "rw-dpsgd" and s.n == 16 and s.cap == 30 and s.budget == Budget(10.0, 1e-6)
    assert (
        s.run_id.startswith("run-") and parse_spec_toml(SPEC).run_id == s.run_id
    )  # content-derived
    mp = s.machine_params()
    assert mp == {"steps": 400, "step_size": 0.05, "sigma": 4.0, "cap": 30, "start": 0}
    assert s.task_kwargs() == {"clip": 0.4}


@pytest.mark.parametrize(
    "edit,message",
    [
        (('protocol = "rw-dpsgd"', 'protocol = "gossip-magic"'), "unknown protocol"),
        (('name = "logreg"', 'name = "no.such:Task"'), "cannot import"),
        (('graph = "hypercube:4"', 'graph = "torus:4"'), "graph"),
        (("sigma = 4.0", "sigma = 0.0"), "sigma must be > 0"),
        (("epsilon = 10.0", "epsilon = -1.0"), "budget.epsilon"),
        (('view_model = "sender-known"', 'view_model = "psychic"'), "view_model"),
        (("cap = 30", "cap = 0"), "cap"),
        (("seed = 7", "colour = 7\nseed = 7"), "unknown key"),
        (("steps = 400\n", ""), "missing steps"),
        (("steps = 400\n", "steps = 0\n"), "steps must be"),
        (('[run]\nprotocol = "rw-dpsgd"', '[run]\nprotocol = "pad-ring-sum"'), "rounds"),
        (
            ('name = "logreg"', 'name = "sum"'),
            "needs a gradient task",
        ),  # a built-in task of the wrong kind
    ],
)
def test_invalid_specs_are_refused_with_reasons(edit, message):
    old, new = edit
    assert old in SPEC
    with pytest.raises(SpecError, match=message):
        parse_spec_toml(SPEC.replace(old, new, 1))


def test_missing_fields_and_bad_toml():
    with pytest.raises(SpecError, match="missing"):
        parse_spec_toml('[run]\nprotocol = "rw-dpsgd"\n')
    with pytest.raises(SpecError, match="TOML"):
        parse_spec_toml("[run\nprotocol=")


def test_sign_verify_roundtrip_and_tamper(key):
    spec = parse_spec_toml(SPEC)
    signed = sign_spec(spec, key)
    wire = signed.to_bytes()
    back = SignedRunSpec.from_bytes(wire)
    assert verify_spec(back, key.public_key()) == spec
    pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert verify_spec(back, pem) == spec
    # tampering with any public parameter breaks the signature
    tampered = SignedRunSpec(dataclasses.replace(spec, sigma=0.5), back.signature)
    with pytest.raises(SpecSignatureError, match="does not verify"):
        verify_spec(tampered, key.public_key())
    forged = SignedRunSpec(dataclasses.replace(spec, run_id="run-0000000000000000"), back.signature)
    with pytest.raises(SpecSignatureError, match="run id"):
        verify_spec(forged, key.public_key())
    other = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(SpecSignatureError):
        verify_spec(back, other.public_key())
    with pytest.raises(SpecSignatureError, match="unsigned"):
        verify_spec(SignedRunSpec(spec, b""), key.public_key())
    with pytest.raises(SpecError):
        SignedRunSpec.from_bytes(b"not json")
    with pytest.raises(SpecError):
        sign_spec(spec, ec.generate_private_key(ec.SECP384R1()))


def test_signature_over_certificate(key):
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "operator")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    signed = sign_spec(parse_spec_toml(SPEC), key, pem)
    back = SignedRunSpec.from_bytes(signed.to_bytes())
    assert back.certificate_pem == pem
    assert verify_spec(back, back.certificate_pem).protocol == "rw-dpsgd"


def test_node_policy_accepts_and_refuses_by_budget():
    spec = parse_spec_toml(SPEC)
    row, det = projected_row(spec, 3)
    assert row.shape == (16,) and row[3] == 0 and np.all(row[np.arange(16) != 3] > 0)
    assert det["view_model"] == "sender-known"
    ok = evaluate_policy(spec, 3)
    assert ok.accept and ok.bound == "certified" and ok.worst_epsilon <= 10.0
    tight = evaluate_policy(spec, 3, Budget(epsilon=0.5 * ok.worst_epsilon, delta=1e-6))
    assert not tight.accept and "over budget" in tight.reason and "certified" in tight.reason
    # the anonymous view model can only lower the projected loss (sender-known ≥ anonymous, PART D 10)
    anon, _ = projected_row(dataclasses.replace(spec, view_model="anonymous"), 3)
    assert np.all(anon <= row + 1e-12)
    # local-DP baseline: no amplification; the walk's certified row is never above it (min of two bounds) ...
    ldp, _ = projected_row(dataclasses.replace(spec, protocol="local-dp-sgd"), 3)
    assert np.all(row <= ldp + 1e-12)
    # ... and strictly below it once σ is large enough for the strict noise condition to allow a high order
    big = dataclasses.replace(spec, graph="hypercube:8", steps=25600, cap=100, sigma=20.0)
    r_big, _ = projected_row(big, 0)
    l_big, _ = projected_row(dataclasses.replace(big, protocol="local-dp-sgd"), 0)
    assert r_big.sum() / 255 < 0.6 * l_big.sum() / 255
    refused = evaluate_policy(
        dataclasses.replace(spec, protocol="pad-ring-sum", graph="ring:16", rounds=1), 0
    )
    assert not refused.accept and "cannot project" in refused.reason


def test_spec_to_machines_runs_and_streams_progress():
    """A verified spec builds the machines (simulator side) and one node's machine (node side) identically."""
    from helpers.engine import synthetic_tasks

    from hushnet.protocols.registry import build_from_spec, machine_for_spec
    from hushnet.sim import Simulator

    spec = parse_spec_toml(SPEC)
    tasks = synthetic_tasks(16, d=3, clip=spec.clip)
    ms = build_from_spec(spec, tasks, progress_every=100)
    seen = []
    sim = Simulator(ms)
    sim.on_metric(lambda m: seen.append((m.name, m.step)))
    res = sim.run()
    assert res.status == "finished" and res.finish.step == spec.steps
    assert [s for name, s in seen if name == "step"] == list(range(100, spec.steps + 1, 100))
    assert res.ledger_counts("gradient").max() <= spec.cap
    # node 5's own machine, built from the spec alone, draws exactly what the simulator's node 5 drew
    m5 = machine_for_spec(spec, 5, tasks[5])
    assert m5.ctx.rng.random() == build_from_spec(spec, tasks)[5].ctx.rng.random()
    assert m5.ctx.run_id == spec.run_id and m5.opt.on_peer_down == "pause"


def test_projection_converts_with_the_one_rule_and_stays_sound():
    """Where the node's projection lives: ``local-dp-sgd`` charges N_u Gaussian releases in the clear, whose
    exact (ε, δ) is μ-GDP with μ = √N_u/σ.  The projection converts their RDP curve with the improved rule:
    never below that exact value (an under-counting conversion fails here), never above Mironov's optimum."""
    import math

    from hushnet.privacy.conversions import gdp_epsilon, linear_rdp_to_dp

    spec = dataclasses.replace(parse_spec_toml(SPEC), protocol="local-dp-sgd")
    N_u, sigma, delta = 30.0, 4.0, 1e-6  # cap = 30
    row, det = projected_row(spec, 3)
    eps = np.delete(row, 3)
    assert np.allclose(eps, linear_rdp_to_dp(N_u / (2 * sigma**2), delta)[0], rtol=1e-12)
    assert np.all(eps >= gdp_epsilon(math.sqrt(N_u) / sigma, delta) - 1e-9)
    s, L = N_u / (2 * sigma**2), math.log(1 / delta)
    a = 1 + math.sqrt(L / s)
    assert np.all(eps < s * a + L / (a - 1) - 0.1)  # the improvement is real, not rounding
    assert set(det["certified_by"][:3]) == {"local-DP"}
    walk_row, walk_det = projected_row(parse_spec_toml(SPEC), 3)
    assert set(walk_det["certified_by"]) - {""} <= {"random-walk", "local-DP"}
