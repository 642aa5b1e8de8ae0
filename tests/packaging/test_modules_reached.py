"""Every module of the ``hushnet`` package is reached by some test (issue 13, "every source module
reached by some test").

A module no test reaches is code nobody runs before a user does: a rename that breaks it, a
dependency it lost, a refactor that left it dead all go unnoticed.  Coverage measures this
(``make coverage``, docs/design/README.md) but takes minutes; this guard is a static stand-in that
runs in a second: starting from every test file (``test_*.py``, ``conftest.py``), it follows
imports through the test helpers and the package's own modules (``ast``, no import is executed) and
fails with the list of modules that nothing reaches.

What counts as an edge from a file to a module:

- ``import a.b`` / ``from a.b import c`` anywhere in the file (also inside functions: lazy imports
  are how this package keeps ``import hushnet`` cheap), ``c`` itself when it is a submodule, and the
  parent packages, which Python executes first;
- a string constant that is exactly a module's name (``importlib.import_module`` tables such as the
  CLI's, ``[python, "-m", "hushnet.cli"]``), except a logger's name (``getLogger("hushnet.x")``);
- a name a PEP 562 package resolves lazily (``_EXPORTS`` in ``hushnet/__init__.py`` and
  ``hushnet/privacy/__init__.py``), only when the file asks for that name: ``from hushnet import
  Client``, ``hushnet.Client``, ``hp.rw_pndp_matrix``.  Listing a module in a lazy table is not
  enough; a test has to ask for one of its names.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


def _package_files() -> dict[str, Path]:
    """Module name -> source file, for every module of the distribution (pyproject's package-dir)."""
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping: dict[str, Path] = {}
    for prefix, folder in cfg["package-dir"].items():
        root = REPO / folder
        for path in root.rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            rel = path.relative_to(root).with_suffix("").parts
            if rel[-1] == "__init__":
                rel = rel[:-1]
            if not all(
                (root.joinpath(*rel[:i]) / "__init__.py").is_file() for i in range(len(rel))
            ):
                continue  # not inside a package (a script such as proto/codegen.py)
            mapping[".".join([prefix, *rel])] = path
    return mapping


def _test_files() -> tuple[dict[str, Path], list[Path]]:
    """(helper module name -> file, root files): tests/ is on sys.path, so helpers import as ``helpers.x``."""
    helpers: dict[str, Path] = {}
    roots: list[Path] = []
    for path in TESTS.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        if path.name.startswith("test_") or path.name == "conftest.py":
            roots.append(path)
        rel = path.relative_to(TESTS).with_suffix("").parts
        if rel[0] == "helpers":
            name = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
            helpers[name] = path
    return helpers, sorted(roots)


def _lazy_exports(tree: ast.Module, package: str) -> dict[str, str]:
    """A PEP 562 package's table: module-level ``{name: "module", ...}`` whose values are modules."""
    table: dict[str, str] = {}
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if not isinstance(value, ast.Dict) or not value.keys:
            continue
        pairs = list(zip(value.keys, value.values))
        if all(
            isinstance(k, ast.Constant)
            and isinstance(k.value, str)
            and isinstance(v, ast.Constant)
            and isinstance(v.value, str)
            and (v.value.startswith("hushnet") or v.value.startswith("."))
            for k, v in pairs
        ):
            for k, v in pairs:
                target = v.value
                if target.startswith("."):
                    target = _resolve_relative(package, target)
                table[k.value] = target
    return table


def _resolve_relative(package: str, dotted: str) -> str:
    level = len(dotted) - len(dotted.lstrip("."))
    base = package.split(".")
    if level > 1:
        base = base[: -(level - 1)]
    rest = dotted.lstrip(".")
    return ".".join([*base, rest]) if rest else ".".join(base)


def _logger_names(tree: ast.Module) -> set[int]:
    """The string constants that name a logger (``getLogger("hushnet.bootstrap")``,
    ``caplog.at_level(..., logger="hushnet.runs")``): module-like names that import nothing."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name == "getLogger":
            ids |= {id(a) for a in node.args}
        ids |= {id(k.value) for k in node.keywords if k.arg == "logger"}
    return ids


class _Graph:
    def __init__(self) -> None:
        self.files = _package_files()
        helpers, self.roots = _test_files()
        self.files.update(helpers)
        self._trees: dict[Path, ast.Module] = {}
        self.lazy = {
            name: _lazy_exports(self._tree(path), name)
            for name, path in self.files.items()
            if path.name == "__init__.py"
        }

    def _tree(self, path: Path) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(path.read_text(), filename=str(path))
        return self._trees[path]

    def _with_parents(self, name: str) -> set[str]:
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & set(self.files)

    def edges(self, path: Path, own_name: str | None) -> set[str]:
        """The modules the file at ``path`` reaches directly (see the module docstring)."""
        tree = self._tree(path)
        is_package = path.name == "__init__.py"
        package = own_name if is_package else (own_name or "").rpartition(".")[0]
        lazy_strings = set()
        if own_name in self.lazy:
            lazy_strings = set(self.lazy[own_name].values())
        out: set[str] = set()
        aliases: dict[str, str] = {}  # local name -> module it is bound to
        loggers = _logger_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    out |= self._with_parents(a.name)
                    if a.asname:
                        aliases[a.asname] = a.name
                    else:
                        top = a.name.split(".")[0]
                        aliases[top] = top
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:
                    mod = _resolve_relative(package, "." * node.level + mod)
                out |= self._with_parents(mod)
                for a in node.names:
                    sub = f"{mod}.{a.name}"
                    if sub in self.files:
                        out |= self._with_parents(sub)
                        aliases[a.asname or a.name] = sub
                    elif a.name in self.lazy.get(mod, {}):
                        out |= self._with_parents(self.lazy[mod][a.name])
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if (
                    node.value in self.files
                    and node.value not in lazy_strings
                    and id(node) not in loggers
                ):
                    out |= self._with_parents(node.value)
        # attribute access through a module alias: hushnet.Client, hp.rw_pndp_matrix, hushnet.net.x
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            chain: list[str] = []
            cur: ast.expr = node
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if not isinstance(cur, ast.Name) or cur.id not in aliases:
                continue
            mod = aliases[cur.id]
            for attr in reversed(chain):
                if f"{mod}.{attr}" in self.files:
                    mod = f"{mod}.{attr}"
                    out |= self._with_parents(mod)
                elif attr in self.lazy.get(mod, {}):
                    out |= self._with_parents(self.lazy[mod][attr])
                    break
                else:
                    break
        return out

    def reached(self) -> set[str]:
        seen: set[str] = set()
        todo: list[str] = []
        for root in self.roots:
            todo.extend(self.edges(root, None))
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            todo.extend(self.edges(self.files[name], name) - seen)
        return seen


def unreached_modules() -> list[str]:
    """The ``hushnet`` modules no test file reaches (sorted)."""
    graph = _Graph()
    package = {n for n in graph.files if n == "hushnet" or n.startswith("hushnet.")}
    return sorted(package - graph.reached())


def test_every_hushnet_module_is_reached_by_some_test() -> None:
    missing = unreached_modules()
    assert not missing, (
        f"{len(missing)} hushnet module(s) no test imports (write a test of its behaviour, or "
        f"delete it if it is dead): {', '.join(missing)}"
    )


def test_the_walk_sees_the_whole_package() -> None:
    """The guard is only as good as its module list: it must find the package's known corners."""
    files = _package_files()
    for name in ("hushnet", "hushnet.cli", "hushnet.bootstrap.service", "hushnet.v1.envelope_pb2"):
        assert name in files, f"module walk missed {name}"
    assert "hushnet.codegen" not in files and not any(n.endswith("codegen") for n in files)
