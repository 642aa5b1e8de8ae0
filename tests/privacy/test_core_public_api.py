"""``hushnet.privacy`` is the researcher's entry point: a lazy public namespace whose import stays cheap.

A node process imports ``hushnet.privacy.ledger`` on every start; if the package ``__init__`` pulled
in scipy (the accountants need it) every node would pay ~0.3 s for nothing.  The docstring's usage
example is executed here so that it cannot drift from the API it shows.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import hushnet.privacy as hp


def test_import_is_cheap_and_lazy() -> None:
    code = (
        "import sys, hushnet.privacy as hp; "
        "heavy = [m for m in sys.modules if m.split('.')[0] == 'scipy' "
        "or m.startswith('hushnet.privacy.')]; "
        "assert not heavy, heavy; hp.rdp_to_dp; "
        "assert 'hushnet.privacy.conversions' in sys.modules; "
        "assert 'hushnet.privacy.randomwalk' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_exported_name_resolves_to_its_module_object() -> None:
    from hushnet.privacy import conversions, ledger, randomwalk

    for name in hp.__all__:
        assert getattr(hp, name) is not None, name
    assert hp.rw_pndp_matrix is randomwalk.rw_pndp_matrix
    assert hp.Ledger is ledger.Ledger
    assert hp.rdp_to_dp is conversions.rdp_to_dp
    assert set(hp.__all__) <= set(dir(hp))


def test_unknown_name_is_a_clear_attribute_error() -> None:
    with pytest.raises(AttributeError, match="hushnet.privacy' has no attribute 'nope'"):
        hp.nope  # noqa: B018


def test_paper_formulas_are_not_exported_as_certified() -> None:
    assert not [n for n in hp.__all__ if "paper" in n.lower() or "thm" in n.lower()]


def test_docstring_usage_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    doc = hp.__doc__ or ""
    lines = []
    for line in doc.split("Usage::", 1)[1].splitlines()[1:]:
        if line.strip() and not line.startswith("    "):
            break
        lines.append(line)
    assert 6 <= len([x for x in lines if x.strip()]) <= 12
    exec(compile("\n".join(line[4:] for line in lines), "<hushnet.privacy docstring>", "exec"), {})
    out = capsys.readouterr().out.split()
    assert "certified" in out and "anonymous" in out
