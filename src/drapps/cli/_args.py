"""What every command group shares: list arguments, the usage error, one-line argparse errors."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from drapps.control.reward import RewardWeights


class UsageError(Exception):
    """Bad input on the command line: ``drapps`` prints it on one line and exits with 2."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def int_list(text: str) -> tuple[int, ...]:
    """``"0,1,2"`` -> ``(0, 1, 2)``."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated ints like 0,1,2, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one int, got {text!r}")
    return values


def name_list(text: str) -> tuple[str, ...]:
    """``"a, b"`` -> ``("a", "b")``."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def reward_weights(text: str) -> RewardWeights:
    """``"start=0.2,energy=1"`` -> ``RewardWeights(start=0.2, energy=1.0)`` (the rest at
    their defaults)."""
    from dataclasses import fields

    from drapps.control.reward import RewardWeights

    names = [f.name for f in fields(RewardWeights)]
    given: dict[str, float] = {}
    for part in name_list(text):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in names:
            raise argparse.ArgumentTypeError(
                f"expected reward weights like start=0.2,energy=1 (names: {', '.join(names)}), "
                f"got {part!r}"
            )
        try:
            given[name] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"reward weight {name} must be a number, got {value.strip()!r}"
            ) from None
    try:
        return RewardWeights(**given)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def step_range(text: str) -> tuple[int, int]:
    """``"20:60"`` -> ``(20, 60)``."""
    start, sep, stop = text.partition(":")
    if not sep or not start.isdigit() or not stop.isdigit():
        raise argparse.ArgumentTypeError(f"expected steps like 20:60, got {text!r}")
    return int(start), int(stop)


def check_positive(args: argparse.Namespace, *names: str, minimum: float = 0.0) -> None:
    """Raise a UsageError naming the first option in ``names`` that is not above ``minimum``
    (or, with an int ``minimum`` >= 1, not at least it)."""
    for name in names:
        value = getattr(args, name)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(minimum, int) and minimum >= 1:
            if value < minimum:
                raise UsageError(f"{flag} must be >= {minimum}, got {value}")
        elif not value > minimum:
            raise UsageError(f"{flag} must be > {minimum:g}, got {value}")


Commands = Any
"""The object ``ArgumentParser.add_subparsers()`` returns."""


def load_object(spec: str, option: str) -> Any:
    """``module:name`` -> that object, importing ``module`` as ``python -m`` would (modules in
    the current folder are found).

    Raises:
        ValueError: the spec is malformed, or the module or the name does not exist; the
            message names ``option``.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{option} must look like module:factory, got {spec!r}")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} for {option}: {exc}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        names = sorted(n for n in dir(module) if not n.startswith("_"))
        raise ValueError(
            f"{module_name!r} has no {attribute!r} for {option}; it has {names}"
        ) from None
