"""Local data: each node reads its own file; demos and tests partition a public data set.

A node's data never leaves it, so loading is strict: a missing file or a file of the wrong shape
is a clear error at run acceptance time, not a crash in the middle of a walk.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class DataFileMissing(FileNotFoundError):
    """The local data file named in the node's configuration does not exist."""


class DataShapeError(ValueError):
    """The local data file parses but does not have the shape the task needs."""


def load_local_data(
    path: str | os.PathLike, *, features: int | None = None, labels: bool = True
) -> tuple[np.ndarray, np.ndarray | None]:
    """Read ``(X, y)`` from a CSV or NPZ file.

    * CSV: numeric, comma-separated, optional header line; the **last column is the label** when
      ``labels`` (otherwise every column is a feature).
    * NPZ: arrays ``X`` (2-D) and, when ``labels``, ``y`` (1-D, same length).

    ``features`` (if given) is the number of feature columns the task expects.
    """
    p = Path(path)
    if not p.is_file():
        raise DataFileMissing(f"local data file {p} does not exist")
    suffix = p.suffix.lower()
    if suffix == ".npz":
        with np.load(p, allow_pickle=False) as z:
            if "X" not in z:
                raise DataShapeError(f"{p}: NPZ file has no array 'X' (has {sorted(z.files)})")
            X = np.asarray(z["X"], dtype=np.float64)
            y = None
            if labels:
                if "y" not in z:
                    raise DataShapeError(f"{p}: NPZ file has no array 'y' (labels)")
                y = np.asarray(z["y"], dtype=np.float64)
    elif suffix in (".csv", ".txt"):
        try:
            arr = np.genfromtxt(p, delimiter=",", dtype=np.float64, skip_header=_header_lines(p))
        except ValueError as exc:
            raise DataShapeError(f"{p}: not a numeric CSV file ({exc})") from exc
        arr = np.atleast_2d(arr)
        if arr.size == 0:
            raise DataShapeError(f"{p}: no data rows")
        if np.isnan(arr).any():
            raise DataShapeError(f"{p}: non-numeric or missing entries")
        if labels:
            if arr.shape[1] < 2:
                raise DataShapeError(f"{p}: need at least one feature column and a label column")
            X, y = arr[:, :-1], arr[:, -1]
        else:
            X, y = arr, None
    else:
        raise DataShapeError(f"{p}: unsupported data file type {suffix!r} (use .csv or .npz)")
    if X.ndim != 2 or X.shape[0] == 0:
        raise DataShapeError(f"{p}: features must be a non-empty 2-D array, got shape {X.shape}")
    if features is not None and X.shape[1] != features:
        raise DataShapeError(f"{p}: {X.shape[1]} feature columns, the task expects {features}")
    if y is not None:
        if y.ndim != 1 or y.shape[0] != X.shape[0]:
            raise DataShapeError(f"{p}: labels of shape {y.shape} for {X.shape[0]} rows")
    if not np.all(np.isfinite(X)):
        raise DataShapeError(f"{p}: features contain NaN or infinity")
    return X, y


def _header_lines(p: Path) -> int:
    with open(p, encoding="utf-8") as fh:
        first = fh.readline()
    try:
        [float(t) for t in first.strip().split(",") if t.strip()]
        return 0
    except ValueError:
        return 1


@dataclass(frozen=True)
class Partition:
    """A public data set split for a demo or a reproduction: per-node shards plus a held-out test set."""

    shards: list[tuple[np.ndarray, np.ndarray]]
    X_test: np.ndarray
    y_test: np.ndarray
    X_train: np.ndarray
    y_train: np.ndarray


def stratified_split(
    y: np.ndarray, train_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test), stratified by label, shuffled with ``default_rng(seed)``.

    Same proportions as the papers' ``train_test_split(train_size=.8, stratify=y)``; the exact
    permutation differs from scikit-learn's.
    """
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in np.unique(y):
        idx = np.flatnonzero(y == label)
        rng.shuffle(idx)
        k = int(round(train_fraction * idx.size))
        train.append(idx[:k])
        test.append(idx[k:])
    tr = np.concatenate(train)
    te = np.concatenate(test)
    rng.shuffle(tr)
    rng.shuffle(te)
    return tr, te


def partition(
    X: np.ndarray,
    y: np.ndarray,
    n_nodes: int,
    per_node: int | None = None,
    *,
    train_fraction: float = 0.8,
    seed: int = 42,
) -> Partition:
    """Stratified 80/20 split, then ``per_node`` consecutive training rows per node (docs/design/spec/randomwalk.md §A.6.3 / B.7.2).

    With ``per_node=None`` each node gets ``len(train) // n_nodes`` rows; the remainder is unused.
    """
    tr, te = stratified_split(y, train_fraction, seed)
    if per_node is None:
        per_node = tr.size // n_nodes
    if per_node < 1 or per_node * n_nodes > tr.size:
        raise DataShapeError(
            f"cannot give {n_nodes} nodes {per_node} rows each from {tr.size} training rows"
        )
    Xtr, ytr = X[tr], y[tr]
    shards = [
        (Xtr[i * per_node : (i + 1) * per_node], ytr[i * per_node : (i + 1) * per_node])
        for i in range(n_nodes)
    ]
    return Partition(shards, X[te], y[te], Xtr[: per_node * n_nodes], ytr[: per_node * n_nodes])


def houses_partition(
    n_nodes: int, per_node: int = 8, *, seed: int = 42, cache_dir=None
) -> Partition:
    """The papers' houses setup: standardised, unit-norm rows, y ∈ {−1,+1}, 80/20, ``per_node`` rows per node."""
    from hushnet.datasets import load_houses

    X, y = load_houses(cache_dir)
    return partition(X, y, n_nodes, per_node, seed=seed)


BREAST_CANCER_FEATURES = ("all", "mean", "error", "worst")


def load_breast_cancer(features: str = "all") -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled Wisconsin diagnostic breast-cancer data, prepared like houses.

    569 rows; ``features`` picks the data set's documented blocks of 10 nucleus measurements —
    ``"mean"``, ``"error"`` (standard error), ``"worst"`` (mean of the three largest values) — or
    ``"all"`` 30.  The chosen columns are standardised, then each row is scaled to unit L2 norm so
    per-example logistic gradients are bounded; y = +1 benign, −1 malignant (majority class:
    benign, 357/569).  The data ships inside the scikit-learn wheel, so the demo runs offline with
    nothing to download; its classes are well separated by a linear model, which is what a 16-node
    private demo needs to show a signal through user-level noise.
    """
    from sklearn.datasets import load_breast_cancer as _sk_load

    if features not in BREAST_CANCER_FEATURES:
        raise ValueError(f"features must be one of {BREAST_CANCER_FEATURES}, got {features!r}")
    d = _sk_load()
    X = np.asarray(d.data, dtype=np.float64)
    if features != "all":
        names = [str(f) for f in d.feature_names]
        pick = {
            "mean": lambda f: f.startswith("mean "),
            "error": lambda f: f.endswith(" error"),
            "worst": lambda f: f.startswith("worst "),
        }[features]
        X = X[:, [i for i, f in enumerate(names) if pick(f)]]
    y = np.where(np.asarray(d.target) == 1, 1.0, -1.0)  # scikit-learn: 0 = malignant, 1 = benign
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    X = X / np.linalg.norm(X, axis=1, keepdims=True)
    return X, y


def breast_cancer_partition(
    n_nodes: int, per_node: int | None = None, *, features: str = "all", seed: int = 42
) -> Partition:
    """Breast-cancer data split 80/20 (stratified), ``per_node`` training rows per node (default: all, evenly)."""
    X, y = load_breast_cancer(features)
    return partition(X, y, n_nodes, per_node, seed=seed)


# ---- public evaluation data (the loss a node may report) ------------------------------------------

PUBLIC_DIR = "public"
_PUBLIC_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\.(npz|csv)$")


@dataclass(frozen=True)
class PublicEval:
    """Evaluation data the node's owner has declared public, and the task that scores a model on it.

    Why only this: a loss is a number about a model *and* some data.  On a node's private rows it
    is a release of that data the accountant never charged; on public rows it releases nothing
    about the data beyond the model itself.  The run spec can only *name* a file (``eval_data``
    in ``[run.protocol_params]``); the node resolves the name inside ``<state>/public/`` — a
    directory its owner fills with files it considers public — so no spec can point a node at its
    private data file.
    """

    name: str
    X: np.ndarray
    y: np.ndarray
    task: object  # a task with evaluate(w, X, y) -> {"loss", "accuracy", ...}

    def evaluate(self, w: np.ndarray) -> dict[str, float]:
        return {k: float(v) for k, v in self.task.evaluate(w, self.X, self.y).items()}  # type: ignore[attr-defined]


def load_public_eval(
    state_dir: str | os.PathLike, name: str | None, task: object
) -> PublicEval | None:
    """The public evaluation set ``name`` of this node (``None`` when the spec names none).

    Raises :class:`ValueError` for a name that is not a plain ``*.npz``/``*.csv`` file name,
    :class:`DataFileMissing` when the node has no such public file, :class:`DataShapeError` when the
    task cannot score a model on it — at acceptance time, so the operator sees the reason.
    """
    if name is None:
        return None
    if not isinstance(name, str) or not _PUBLIC_NAME.match(name) or ".." in name:
        raise ValueError(
            f"eval_data must be a plain .npz/.csv file name from the node's {PUBLIC_DIR}/ directory, "
            f"got {name!r}"
        )
    path = Path(state_dir) / PUBLIC_DIR / name
    if not path.is_file():
        raise DataFileMissing(
            f"no public evaluation file {name!r} in this node's {PUBLIC_DIR}/ directory"
        )
    X, y = load_local_data(path)
    assert y is not None
    ev = PublicEval(name, X, y, task)
    try:
        ev.evaluate(np.zeros(int(getattr(task, "dim"))))
    except (ValueError, AttributeError, TypeError) as exc:
        raise DataShapeError(
            f"public evaluation file {name!r} does not fit the task: {exc}"
        ) from exc
    return ev
