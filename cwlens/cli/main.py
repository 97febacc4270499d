"""``cwlens``: one command, several subcommands. ``cwlens <subcommand> --help`` for each.

Exit codes: 0 success, 1 an error cwlens explains (bad input, missing model, a path it
cannot write), 2 bad command-line usage (argparse, or an option the model cannot take:
:class:`~cwlens.errors.UsageError`), 130 interrupted. Errors are one line,
``cwlens: error: ...``; ``--debug`` shows the traceback.
"""

import argparse
import sys
from contextlib import contextmanager

from cwlens.cli.common import add_debug_flag
from cwlens.errors import CwlensError, UsageError

EPILOG = """examples:
  cwlens demo                                   # the offline model on one GSM8K problem
  cwlens analyze --text "The capital of France is Paris" --out report.html
  cwlens graph --text "When Mary and John went to the store, John gave" --out runs/graph/ioi.html
  cwlens sinks --dataset gsm8k --samples 50     # attention-sink analysis
  cwlens faithfulness --dataset gsm8k --samples 50 --rates 0.1,0.3,0.5
  cwlens figures                                # regenerate every figure in figures/
  cwlens demo --model gpt2 --device cuda        # any TransformerLens-loadable model
models: a short name (smollm2-135m works offline), a local HF directory, or a hub id.
"""


# Each subcommand lives in its own module with a ``register(subparsers)`` function.
SUBCOMMANDS = ("demo", "analyze", "sinks", "faithfulness", "accuracy", "figures", "circuits",
               "export", "replicate", "groundtruth", "graph")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cwlens",
        description="Contribution weights for TransformerLens models: where attention "
        "heads look vs what they move.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from cwlens import __version__

    parser.add_argument("--version", action="version", version=f"cwlens {__version__}")
    add_debug_flag(parser)
    sub = parser.add_subparsers(dest="command", metavar="<command>")

    import importlib

    for name in SUBCOMMANDS:
        importlib.import_module(f"cwlens.cli.{name}").register(sub)
    return parser


def _quiet_libraries() -> None:
    """No download/loading progress bars or library warnings in the terminal output."""
    import os
    import warnings

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore", category=UserWarning, module="transformer_lens")
    warnings.filterwarnings("ignore", category=FutureWarning)


def main(argv: list[str] | None = None) -> int:
    _quiet_libraries()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        from cwlens.core.env import check_all

        check_all()  # a misspelt CWLENS_* setting stops here, before a model loads
        with _notes():
            return args.func(args)
    except (CwlensError, OSError) as err:  # model load errors arrive as ModelNotAvailableError
        if getattr(args, "debug", False):
            raise
        print(f"cwlens: error: {_one_line(err)}", file=sys.stderr)
        return 2 if isinstance(err, UsageError) else 1
    except KeyboardInterrupt:
        if getattr(args, "debug", False):
            raise
        print("cwlens: interrupted", file=sys.stderr)
        return 130


@contextmanager
def _notes():
    """A :class:`~cwlens.errors.CwlensWarning` (e.g. a text cut to the model's context) is
    printed as one ``cwlens: note: ...`` line on stderr, each time it happens."""
    import warnings

    from cwlens.errors import CwlensWarning

    with warnings.catch_warnings():
        default = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, CwlensWarning):
                print(f"cwlens: note: {' '.join(str(message).split())}", file=sys.stderr)
            else:
                default(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        warnings.simplefilter("always", CwlensWarning)
        yield


def _one_line(err: BaseException) -> str:
    """The error as one line (a CwlensError's message may list options on more lines)."""
    if isinstance(err, OSError) and not isinstance(err, CwlensError) and err.strerror:
        where = f": {err.filename!r}" if err.filename else ""
        return f"{err.strerror}{where}"
    return " ".join(str(err).split()) or type(err).__name__


if __name__ == "__main__":
    sys.exit(main())
