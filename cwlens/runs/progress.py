"""Progress bars: the one helper behind every bar cwlens draws.

A bar counts the unit of work (forward passes, heads patched, batches), shows the rate and
the time left, and goes to stderr, so that stdout stays the command's results. It shows
when stderr is a terminal (or a notebook), not in a log file or a pipe; the environment
variable ``CWLENS_PROGRESS`` overrides that: ``1`` draws the bars anyway (e.g. to follow a
run's log), ``0`` never. ``enabled=False`` (the CLI's ``--no-progress``) turns a bar off
whatever the terminal.

Work deep inside a step reports with :func:`tick` (the faithfulness sweep after each
forward pass, head patching after each layer), which advances the innermost bar opened
with ``ticks=True``, or the callback given to :func:`ticking`; without one it does
nothing, so library code can tick whether or not anyone draws a bar.
"""

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from tqdm.auto import tqdm

from cwlens.core.env import flag

ENV = "CWLENS_PROGRESS"  # a switch of cwlens.core.env: 1/true/yes/on, 0/false/no/off
#: tqdm's redraw limits: at most every 0.1 s (tests set 0 and 1 to see every count)
MIN_INTERVAL: float = 0.1
MIN_ITERS: int | None = None

_ticker: ContextVar[Callable[[int], Any] | None] = ContextVar("cwlens_progress_ticker", default=None)


def _in_notebook() -> bool:
    """A Jupyter kernel (its stderr is no terminal, but it draws tqdm's widgets)."""
    shell = sys.modules.get("IPython")
    get = getattr(shell, "get_ipython", None)
    return get is not None and type(get()).__name__ == "ZMQInteractiveShell"


def shown(enabled: bool = True) -> bool:
    """Whether a bar is drawn: ``enabled``, and ``CWLENS_PROGRESS`` (``1`` / ``0``) or,
    when it is unset, stderr being a terminal or a notebook. Another value of
    ``CWLENS_PROGRESS`` is refused (:func:`cwlens.core.env.flag`)."""
    wanted = flag(ENV)  # refuses a value it does not take, even with enabled=False
    if not enabled:
        return False
    if wanted is not None:
        return wanted
    try:
        return sys.stderr.isatty() or _in_notebook()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def new_bar(total: float | None, desc: str, unit: str, *, initial: float = 0,
            enabled: bool = True):
    """A tqdm bar on stderr, or None when :func:`shown` says no bar is drawn."""
    if not shown(enabled):
        return None

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr,
                dynamic_ncols=True, smoothing=0.1, mininterval=MIN_INTERVAL, miniters=MIN_ITERS)


@contextmanager
def ticking(callback: Callable[[int], Any] | None) -> Iterator[None]:
    """Within the block, :func:`tick` calls ``callback(n)`` (None: ticks are dropped)."""
    token = _ticker.set(callback)
    try:
        yield
    finally:
        _ticker.reset(token)


def tick(n: int = 1) -> None:
    """``n`` units of work done: advances the innermost ticking bar, if there is one."""
    callback = _ticker.get()
    if callback is not None:
        callback(n)


def status(text: str, enabled: bool = True) -> None:
    """One line on stderr saying which step starts (``cwlens: token flow ...``), where a
    bar would be drawn (:func:`shown`): for a step of a few seconds with nothing to count."""
    if shown(enabled):
        print(f"cwlens: {text}", file=sys.stderr, flush=True)


class Bar:
    """What :func:`bar` yields: :meth:`update` (what :func:`tick` calls) and ``n``, the
    units counted so far (drawn or not)."""

    def __init__(self, bar):
        self._bar = bar
        self.n = 0

    def update(self, k: int = 1) -> None:
        self.n += k
        if self._bar is not None:
            self._bar.update(k)


@contextmanager
def bar(total: float | None, desc: str, unit: str, *, enabled: bool = True, initial: float = 0,
        ticks: bool = False) -> Iterator[Bar]:
    """A progress bar for a block (drawn only where :func:`shown`); with ``ticks``,
    :func:`tick` inside the block advances it."""
    drawn = new_bar(total, desc, unit, initial=initial, enabled=enabled)
    out = Bar(drawn)
    try:
        with ticking(out.update if ticks else _ticker.get()):
            yield out
    finally:
        if drawn is not None:
            drawn.close()
