"""Specs the CLI and the nodes must refuse with one clear line (issue 14, points 5 and 6).

The real ``hushnet`` CLI runs as a subprocess: a spec with NaN/infinity, a walk of 10^12 steps or a
graph of a million vertices is refused *before* anything connects, allocates or computes — one
``hushnet: error:`` line naming the field, no traceback.  The node side runs the same
:meth:`RunSpec.validate` (and :meth:`SignedRunSpec.from_bytes`) on what arrives over the wire.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import pytest

from hushnet.runs.spec import MAX_RUN_NODES, MAX_RUN_STEPS, SignedRunSpec, SpecError, spec_from_dict

REPO = pathlib.Path(__file__).resolve().parents[2]

BASE = {
    "protocol": "rw-dpsgd",
    "graph": "hypercube:4",
    "steps": "680",
    "sigma": "4.5",
    "clip": "0.1",
    "step_size": "0.01",
    "seed": "7",
}


def _toml(run: dict[str, str], epsilon: str = "12.0") -> str:
    lines = ["[run]"] + [
        f"{k} = {v if k != 'protocol' and k != 'graph' else json.dumps(v)}" for k, v in run.items()
    ]
    return "\n".join(
        lines
        + [
            "",
            "[task]",
            'name = "logreg"',
            "",
            "[budget]",
            f"epsilon = {epsilon}",
            "delta = 1e-5",
            "",
        ]
    )


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory) -> pathlib.Path:
    """A real bootstrap process (the operator identity and a directory to reach; no nodes needed)."""
    from hushnet.net.cluster import pick_port

    state = tmp_path_factory.mktemp("boot")
    port = pick_port(["127.0.0.1"])
    log = open(state / "bootstrap.out", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hushnet.cli",
            "bootstrap",
            "serve",
            "--state-dir",
            str(state),
            "--listen",
            f"127.0.0.1:{port}",
            "--topology",
            "hypercube:4",
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not (state / "bootstrap.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, (
                state / "bootstrap.out"
            ).read_text()
            time.sleep(0.2)
        yield state
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _cli_start(state: pathlib.Path, text: str) -> subprocess.CompletedProcess:
    spec = state / "spec.toml"
    spec.write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "hushnet.cli", "run", "start", str(spec), "--state-dir", str(state)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one_line_refusal(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("hushnet: error:"), proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("sigma", "nan", "sigma"),
        ("sigma", "inf", "sigma"),
        ("step_size", "-inf", "step_size"),
    ],
)
def test_cli_refuses_non_finite_run_fields(bootstrap, field, value, needle) -> None:
    proc = _cli_start(bootstrap, _toml({**BASE, field: value}))
    line = _one_line_refusal(proc, needle)
    assert "finite" in line


def test_cli_refuses_non_finite_budget(bootstrap) -> None:
    line = _one_line_refusal(_cli_start(bootstrap, _toml(BASE, epsilon="nan")), "budget.epsilon")
    assert "finite" in line


def test_cli_refuses_a_trillion_steps(bootstrap) -> None:
    line = _one_line_refusal(
        _cli_start(bootstrap, _toml({**BASE, "steps": "1000000000000"})), "steps"
    )
    assert f"{MAX_RUN_STEPS:,}" in line or str(MAX_RUN_STEPS) in line


def test_cli_refuses_a_million_vertex_graph(bootstrap) -> None:
    line = _one_line_refusal(
        _cli_start(bootstrap, _toml({**BASE, "graph": "hypercube:20"})), "hypercube:20"
    )
    assert "1048576" in line and str(MAX_RUN_NODES) in line


@pytest.mark.parametrize(
    "graph,n",
    [
        ("complete:9000", 9000),
        ("ring:100000", 100000),
        ("grid:100x100", 10000),
        ("er:20000:0.1:1", 20000),
        ("regular:9000:4:1", 9000),
        ("geometric:9000:0.1:1", 9000),
        ("sbm:5000,5000:0.1:0.01:1", 10000),
        ("hypercube:14", 16384),
    ],
)
def test_validate_refuses_large_graphs_without_building_them(graph, n) -> None:
    spec = spec_from_dict(
        {
            "run": {"protocol": "rw-dpsgd", "graph": graph, "steps": 10, "seed": 1, "sigma": 4.0},
            "task": {"name": "logreg"},
            "budget": {"epsilon": 10.0, "delta": 1e-5},
        }
    )
    with pytest.raises(SpecError, match=f"{n} vertices"):
        spec.validate()


def test_validate_refuses_ring_rounds_beyond_the_step_limit() -> None:
    spec = spec_from_dict(
        {
            "run": {
                "protocol": "pad-ring-sum",
                "graph": "ring:16",
                "rounds": MAX_RUN_STEPS,
                "seed": 1,
                "sigma": 2.0,
            },
            "task": {"name": "sum"},
            "budget": {"epsilon": 10.0, "delta": 1e-5},
        }
    )
    with pytest.raises(SpecError, match="rounds"):
        spec.validate()


def test_wire_spec_with_nan_is_a_spec_error() -> None:
    """A hand-built wire spec (JSON allows NaN) is refused by the node as a spec, not a crash."""
    doc = {
        "spec": {
            "protocol": "rw-dpsgd",
            "task": "logreg",
            "graph": "hypercube:4",
            "steps": 10,
            "seed": 1,
            "sigma": float("nan"),
            "budget": {"epsilon": 1.0, "delta": 1e-5},
        },
        "signature": "AAAA",
        "certificate": "",
    }
    with pytest.raises(SpecError, match="finite"):
        SignedRunSpec.from_bytes(json.dumps(doc).encode())


def test_deeply_nested_wire_spec_is_refused_by_depth() -> None:
    """Point 9b: a 100 000-deep JSON document is refused by a depth limit, not a RecursionError."""
    deep = b'{"spec": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(SpecError, match="nested"):
        SignedRunSpec.from_bytes(deep)


@pytest.mark.parametrize(
    "params,needle",
    [
        ({"rounds": 10**12}, "protocol_params.rounds"),
        ({"ks": [10**7, 10**7]}, "protocol_params.ks"),
    ],
)
def test_validate_refuses_gossip_lengths_beyond_the_limit(params, needle) -> None:
    spec = spec_from_dict(
        {
            "run": {
                "protocol": "muffliato",
                "graph": "ring:8",
                "steps": 10,
                "seed": 1,
                "sigma": 1.0,
                "protocol_params": params,
            },
            "task": {"name": "mean"},
            "budget": {"epsilon": 10.0, "delta": 1e-5},
        }
    )
    with pytest.raises(SpecError, match=needle.replace(".", r"\.")):
        spec.validate()
