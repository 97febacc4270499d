"""Checks of user-given values shared by the API and the command line.

Each raises a :class:`~cwlens.errors.CwlensError` subclass whose message names the
argument, the value and what to pass instead.
"""

import math

from cwlens.errors import EmptyInputError, InvalidArgumentError


def positive_int(value: object, name: str) -> int:
    """``value`` if it is an int >= 1 (bools refused), else :class:`InvalidArgumentError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer (1, 2, ...); got {value!r}.")
    return value


def max_tokens(value: object, name: str = "max_tokens") -> int | None:
    """A truncation length: a positive int, or None for whole texts (0 and negatives refused:
    they would silently mean "everything" or "drop the end")."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(
            f"{name} must be a positive number of tokens (e.g. 128), or None for whole texts; "
            f"got {value!r}."
        )
    return value


def rate(value: object, name: str = "rate") -> float:
    """A fraction in [0, 1] (a finite float or int, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgumentError(f"{name} must be a number in [0, 1]; got {value!r}.")
    if not 0.0 <= value <= 1.0:
        raise InvalidArgumentError(
            f"{name} must be in [0, 1] (the fraction of entries removed); got {value!r}."
        )
    return float(value)


def text(value: object, name: str = "text") -> str:
    """A non-empty string (whitespace only counts as empty)."""
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{name} must be a string; got {type(value).__name__}.")
    if not value.strip():
        raise EmptyInputError(f"The {name} is empty: pass a text with at least one word.")
    return value
