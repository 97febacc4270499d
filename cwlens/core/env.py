"""cwlens' environment variables: one parser, one rule.

Every ``CWLENS_*`` variable is read here (:data:`VARIABLES` lists them). Unset or empty:
its default. A switch (:func:`flag`) takes ``1``/``true``/``yes``/``on`` or
``0``/``false``/``no``/``off`` in any case; a number (:func:`number`) a finite decimal in
its range. Any other value is refused with :class:`~cwlens.errors.InvalidArgumentError`
naming the variable, the value and the values it takes -- never silently ignored (``CWLENS_PROGRESS=sometimes``
used to fall back to the terminal test while ``CWLENS_NATIVE=maybe`` was refused).
"""

import math
import os

from cwlens.errors import InvalidArgumentError

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")

#: every variable cwlens reads, and what it sets (docs/operations.md lists the same)
VARIABLES: dict[str, str] = {
    "CWLENS_CACHE": "folder of the converted offline models and compiled kernels (default ~/.cache/cwlens)",
    "CWLENS_PROGRESS": "switch: draw progress bars (1) or never (0); unset: when stderr is a terminal or notebook",
    "CWLENS_NATIVE": "switch: use the C kernels where a compiler is found (1, default) or torch alone (0)",
    "CWLENS_DIST_TIMEOUT_S": "seconds a torchrun rank waits at a barrier (a number above 0; default 7200)",
    "CWLENS_TEST_WRITE_DELAY": "test hook: seconds to sleep before an atomic rename (a number >= 0; default 0)",
}


def _raw(name: str) -> str | None:
    if name not in VARIABLES:  # a typo here would read an unset variable forever
        raise KeyError(f"{name} is not one of cwlens' environment variables ({', '.join(VARIABLES)})")
    value = os.environ.get(name)
    return None if value is None or not value.strip() else value


def flag(name: str, default: bool | None = None) -> bool | None:
    """The switch ``name``: True for :data:`ON`, False for :data:`OFF` (any case, spaces
    around ignored), ``default`` when unset or empty; anything else raises
    :class:`~cwlens.errors.InvalidArgumentError` naming the values it takes."""
    value = _raw(name)
    if value is None:
        return default
    word = value.strip().lower()
    if word in ON:
        return True
    if word in OFF:
        return False
    raise InvalidArgumentError(
        f"{name}={value!r} is not a setting: use 0 (or false, no, off) or 1 (or true, yes, on), "
        f"or unset it. {name}: {VARIABLES[name]}.")


def number(name: str, default: float, minimum: float = 0.0, inclusive: bool = False,
           error: type[Exception] = InvalidArgumentError) -> float:
    """The number ``name`` (``default`` when unset or empty): a finite decimal above
    ``minimum`` (``inclusive``: or equal); anything else raises ``error`` naming the range."""
    value = _raw(name)
    if value is None:
        return default
    try:
        x = float(value)
    except ValueError:
        x = float("nan")
    if not (math.isfinite(x) and (x >= minimum if inclusive else x > minimum)):
        bound = f"{'at least' if inclusive else 'above'} {minimum:g}"
        raise error(f"{name}={value!r} is not a number {bound}: set it to e.g. {name}={default:g}, "
                    f"or unset it for the default {default:g}. {name}: {VARIABLES[name]}.")
    return x


def check_all() -> None:
    """Refuse now any switch or number set to a value it does not take (the ``cwlens``
    command calls it first, so a misspelt setting stops the run before a model loads)."""
    flag("CWLENS_PROGRESS")
    flag("CWLENS_NATIVE")
    number("CWLENS_TEST_WRITE_DELAY", 0.0, inclusive=True)
