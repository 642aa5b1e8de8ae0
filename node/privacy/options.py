"""Typed options for the accountants: one frozen dataclass per family instead of a dozen keywords.

An accountant with a dozen keyword parameters is easy to call wrongly (a misspelt keyword, a
label from another accountant) and hard to pass around; a frozen dataclass is checked once, in
``__post_init__``, with a one-line error, and can be built once and reused across calls.  The
accountants with many callers still accept the old keywords (:func:`resolve`) and fold them
into the options object, so both call forms give the same value.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, TypeVar

__all__ = ["build", "resolve", "check_choice", "check_positive"]

O = TypeVar("O")


def resolve(cls: type[O], options: O | None, overrides: dict[str, Any], where: str) -> O:
    """``options`` (or the defaults) with ``overrides`` applied and validated again.

    Unknown keywords and an options object of the wrong type are one-line ``TypeError``s naming
    the accountant and the options it takes."""
    if options is not None and not isinstance(options, cls):
        raise TypeError(f"{where}: options must be a {cls.__name__}, got {type(options).__name__}")
    if overrides:
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(
                f"{where}: unknown option(s) {', '.join(unknown)}; "
                f"{cls.__name__} has {', '.join(sorted(names))}"
            )
    base = options if options is not None else cls()
    return replace(base, **overrides) if overrides else base  # type: ignore[type-var]


def check_choice(name: str, value: Any, choices: tuple, *, optional: bool = False) -> None:
    """``value`` must be one of ``choices`` (or ``None`` when ``optional``)."""
    if optional and value is None:
        return
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")


def check_positive(name: str, value: Any, *, optional: bool = False, strict: bool = True) -> None:
    """``value`` must be a number > 0 (``>= 0`` if not ``strict``; or ``None`` when ``optional``)."""
    if optional and value is None:
        return
    try:
        ok = value > 0 if strict else value >= 0
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"{name} must be {'>' if strict else '>='} 0; got {value!r}")


def build(cls: type[O], kwargs: dict[str, Any], where: str) -> O:
    """``cls(**kwargs)`` with unknown keywords reported as one line naming the accountant
    (for options classes with required fields, where :func:`resolve` has no defaults to start from)."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(kwargs) - names)
    if unknown:
        raise TypeError(
            f"{where}: unknown option(s) {', '.join(unknown)}; {cls.__name__} has {', '.join(sorted(names))}"
        )
    return cls(**kwargs)
