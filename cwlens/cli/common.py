"""Flags shared by every subcommand, so they read the same everywhere."""

import argparse
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import cwlens
from cwlens.cli import arg_types
from cwlens.engine.handle import ModelHandle, wrap
from cwlens.runs.progress import status

DEFAULT_MODEL = "smollm2-135m"  # --model's default (cwlens.engine.models.DEFAULT_MODEL, light)


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default=DEFAULT_MODEL,
        help="short name, local Hugging Face directory or hub id (default: %(default)s, offline)",
    )
    p.add_argument("--device", default=None, type=arg_types.device,
                   help="cpu, cuda, cuda:1, mps (default: cuda if available)")
    add_debug_flag(p, argparse.SUPPRESS)


def load_handle(args, **placed) -> ModelHandle:
    """The handle of ``cwlens.load_model(args.model, **placed)`` (default
    ``device=args.device``): a command fetches it here, once, and passes it down. A line on
    stderr before and after where progress is shown (a terminal, unless ``--no-progress``):
    loading can take a minute (dequantizing a GGUF the first time)."""
    show = not getattr(args, "no_progress", False)
    status(f"loading {args.model} ...", show)
    t0 = time.perf_counter()
    model = cwlens.load_model(args.model, **(placed or {"device": args.device}))
    status(f"{args.model} loaded in {time.perf_counter() - t0:.0f} s", show)
    return wrap(model)


def add_debug_flag(p: argparse.ArgumentParser, default=False) -> None:
    """``--debug``: show the full traceback of an error (before or after the subcommand)."""
    p.add_argument("--debug", action="store_true", default=default,
                   help="on an error, show the full traceback instead of one line")


def add_figures_flag(p, what: str = "figures") -> None:
    """``--figures``: where a command draws its figures. Default: ``<--out>/figures``, in
    the run's own folder, so a run never rewrites the repository's ``figures/``; pass
    ``--figures figures`` to do so on purpose, ``''`` for no figures. Read it with
    :func:`figures_dir`."""
    p.add_argument("--figures", default=None,
                   help=f"folder for the {what}, '' for none (default: <out>/figures, inside "
                   "the run's folder; --figures figures rewrites the repository's figures)")


def figures_dir(args, out: str | None = None) -> str:
    """``--figures`` as given (``''``: none), or ``<out>/figures`` when it was left out
    (``out``: the results folder, ``--out`` by default)."""
    return str(Path(out or args.out) / "figures") if args.figures is None else args.figures


def add_progress_flag(p) -> None:
    """``--no-progress``. Progress bars go to stderr, and only when it is a terminal
    (``CWLENS_PROGRESS=1`` forces them on, ``=0`` off: :mod:`cwlens.runs.progress`)."""
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars (they go to stderr, and only when it is a terminal)")


def add_past_context_flag(p: argparse.ArgumentParser) -> None:
    """``--past-context``: texts run past the model's context instead of being cut there
    (rotary models; refused with exit 2 on learned-position ones). Read as
    ``args.past_context`` into each command's configuration (docs/inputs.md)."""
    p.add_argument(
        "--past-context", action="store_true",
        help="run texts past the model's context (n_ctx) instead of cutting them there: "
        "rotary-position models only (Llama, Mistral, Qwen, Gemma, SmolLM2), which run on at "
        "positions never seen in training (a note says so); refused on learned-position "
        "models (GPT-2, BERT)")


def stored_differences(stored: dict, asked: Mapping[str, tuple[str, object, object]]) -> list[str]:
    """What a command that reads stored results (``--report-only``, ``--plot-only``,
    ``--table-only``) does not follow: ``asked`` maps each flag to ``(stored key, this
    command's value, the flag's default)``; one entry per flag given another value than
    its default and than ``stored``'s, e.g. ``--rates 0.5 (asked: 0.3)``, or
    ``no --non-causal (asked)`` for a switch."""
    out = []
    for flag, (key, value, default) in asked.items():
        value, default = json.loads(json.dumps(value)), json.loads(json.dumps(default))
        if key in stored and value != default and value != stored[key]:
            out.append(f"no {flag} (asked)" if isinstance(value, bool)
                       else f"{flag} {shown(stored[key])} (asked: {shown(value)})")
    return out


def shown(value) -> str:
    """A stored value the way its flag spells it (lists comma-separated, None as ``all``)."""
    if isinstance(value, list | tuple):
        return ",".join(map(shown, value))
    if value is None:
        return "all"
    return f"{value:g}" if isinstance(value, float) else str(value)


def note_ignored(mode: str, doing: str, where, differ: list[str], why: str = "") -> None:
    """The note (stderr) that ``mode`` (e.g. ``--report-only``) ignores the ``differ``
    flags (:func:`stored_differences`) of the run stored in ``where``."""
    if differ:
        print(f"cwlens: note: {mode} {doing} as they are; {where} was run with "
              f"{'; '.join(differ)}: those flags are ignored here{why}. Rerun without {mode}, "
              "with another --out, for the asked configuration.", file=sys.stderr)
