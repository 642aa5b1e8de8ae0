"""Package discovery under the import names of pyproject.toml's ``package-dir``.

setuptools cannot discover packages through a ``package-dir`` rename (``node/`` is installed as
``hushnet``), and a hand-kept list meant that a new sub-package — a new protocol family — also needed
a line there or it was silently missing from a wheel (a Docker image).  Everything else about the
distribution is in pyproject.toml.
"""

import pathlib
import tomllib

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).resolve().parent


def packages() -> list[str]:
    """Every package under each folder of ``package-dir``, named under its import name."""
    roots = tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    found: list[str] = []
    for name, folder in roots.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(str(HERE / folder))]
    # a folder that is itself mapped (hushnet.bootstrap) is not also a sub-package of its parent
    return sorted(set(found))


setup(packages=packages())
