"""Settings of the refill runtime, whole numbers or one of a few names, given or read from the
environment: a value given is checked as such, an unset variable gives the default, and
anything else is a SpecPilotError naming where the value came from and what it may be."""
from __future__ import annotations

import os
from typing import Optional, Sequence

from specpilot.ir.errors import SpecPilotError


def _bound(most: Optional[int]) -> str:
    return ">= 1" if most is None else f"from 1 to {most}"


def env_count(name: str, default: int, unit: str, most: Optional[int] = None) -> int:
    """The whole number >= 1 (and <= `most`) the environment variable `name` holds, `default`
    where it is unset; a SpecPilotError naming the variable and its `unit` otherwise."""
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1 or (most is not None and count > most) or not value.strip().isascii():
        raise SpecPilotError(f"{name}={value!r}: expected a whole number of {unit} "
                             f"{_bound(most)}")
    return count


def given_count(value, what: str, unit: str, most: Optional[int] = None) -> int:
    """`value`, a whole number >= 1 (and <= `most`) given for `what`; a SpecPilotError
    otherwise (a bool is not a count)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 \
            or (most is not None and value > most):
        raise SpecPilotError(f"{what} {value!r}: expected a whole number of {unit} "
                             f"{_bound(most)}")
    return value


def env_choice(name: str, default: str, choices: Sequence[str], given: Optional[str] = None,
               what: str = "") -> str:
    """`given` (named `what` in an error) if not None, else the environment variable `name`'s
    value, else `default`; one of `choices`, or a SpecPilotError naming where it came from."""
    value = given if given is not None else os.environ.get(name, default)
    if value not in choices:
        where = f"{what} {value!r}" if given is not None else f"{name}={value!r}"
        raise SpecPilotError(f"{where}: expected one of {', '.join(choices)}")
    return value
