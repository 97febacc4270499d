"""``python -m cwlens.lmeval`` (or ``cwlens-lm-eval``): the ``lm_eval`` command with the
``cwlens-masked`` model registered and the cwlens task folder on the include path.

Arguments are lm-eval's own; ``--include_path task_dir()`` is added (unless given) so
``--tasks cwlens_boolq`` resolves. Dataset downloads are switched
off (``HF_DATASETS_OFFLINE=1`` unless set): the cwlens tasks read shipped files.

Errors follow the ``cwlens`` command's contract: one ``cwlens-lm-eval: error: ...`` line
naming the value and the fix, exit 2 for a bad argument (an unknown or bad ``--model_args``
entry, an unknown ``--tasks`` or ``--model`` name), 1 for another error cwlens explains
(a model that cannot be loaded, a path it cannot write), 130 interrupted; ``--debug`` (taken
out before lm-eval reads the arguments) shows the traceback instead.
"""

import difflib
import os
import sys

from cwlens.engine.models.loading import check_device, resolve
from cwlens.engine.models.registry import MODELS
from cwlens.errors import CwlensError, UsageError
from cwlens.lmeval import MODEL_NAME, TASKS, register, task_dir
from cwlens.lmeval.settings import read_model_args

PROG = "cwlens-lm-eval"


def with_task_dir(argv: list[str], folder: str) -> list[str]:
    """``argv`` plus ``--include_path folder``, unless an include path is given (lm-eval
    takes one folder there: copy the cwlens YAMLs and ``cwlens_tasks.py`` into yours)."""
    if any(a == "--include_path" or a.startswith("--include_path=") for a in argv):
        return list(argv)
    return [*argv, "--include_path", folder]


def lm_eval_usage_error(err: ValueError):
    """A :class:`~cwlens.errors.UsageError` saying what to pass instead, for lm-eval's own
    ``ValueError`` of an unknown ``--tasks`` or ``--model`` name (None for any other: a
    bug, whose traceback is shown)."""
    text = " ".join(str(err).split())
    if text.startswith("Tasks not found:"):
        names = text.removeprefix("Tasks not found:").split(".")[0].replace(",", " ").split()
        hints = [f"{n!r} (did you mean {close[0]!r}?)" if close else repr(n)
                 for n in names for close in [difflib.get_close_matches(n, TASKS, n=1)]]
        return UsageError(
            f"unknown --tasks {', '.join(hints)}: the cwlens tasks are {', '.join(TASKS)}; "
            f"lm-eval lists its own with `lm-eval ls tasks` (older lm-eval: --tasks list).")
    if "no model for this name found" in text:
        return UsageError(f"{text.split('!')[0]}: pass --model {MODEL_NAME} (cwlens' masked model).")
    return None


def _values(args: list[str], *flags: str) -> list[str] | None:
    """The values given to the first of ``flags`` (``--flag v [v ...]``, ``--flag=v``), or
    None where it is absent."""
    for i, arg in enumerate(args):
        for flag in flags:
            if arg.startswith(flag + "="):
                return [arg[len(flag) + 1:]]
            if arg == flag:
                values = []
                for value in args[i + 1:]:
                    if value.startswith("-"):
                        break
                    values.append(value)
                return values
    return None


def check_model_args(args: list[str]) -> None:
    """Read ``--model_args`` of a ``cwlens-masked`` run as the model will
    (:func:`cwlens.lmeval.settings.read_model_args`), before lm-eval starts: a bad entry is
    refused at once, not after lm-eval has indexed its tasks."""
    from lm_eval.utils import simple_parse_args_string  # optional: lm_eval (the lmeval extra)

    model = _values(args, "--model", "-M")
    given = _values(args, "--model_args", "-a")
    if not model or model[0] != MODEL_NAME or not given or given[0].lstrip().startswith("{"):
        return  # another model, no model_args, or a JSON object: lm-eval reads it
    parsed = simple_parse_args_string(",".join(given))
    read_model_args({k: v for k, v in parsed.items() if k not in ("pretrained", "device")})

    device = parsed.get("device")
    if device:
        check_device(str(device))  # asked in --model_args: cuda without a GPU is refused
    name = str(parsed.get("pretrained") or "")
    if name and name.lower() not in MODELS:  # (a short name's files are found when it loads)
        resolve(name)  # a name that is no model and no folder, a folder without config.json


def _one_line(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror and type(err).__module__ == "builtins":
        return f"{err.strerror}" + (f": {err.filename!r}" if err.filename else "")
    return " ".join(str(err).split()) or type(err).__name__


def _run(args: list[str]) -> None:
    register()
    check_model_args(args)
    if args and args[0] not in ("-h", "--help"):
        args = with_task_dir(args, task_dir())
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from lm_eval.__main__ import cli_evaluate  # optional: lm_eval (the lmeval extra)

    sys.argv = ["lm_eval", *args]
    cli_evaluate()


def main(argv: list[str] | None = None) -> int:
    """Run lm-eval on ``argv`` (default: the command line); the exit status (see the module
    docstring). lm-eval's own usage errors (argparse) exit 2 as they are."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    try:
        _run(args)
    except (CwlensError, OSError, ValueError) as err:
        usage = lm_eval_usage_error(err) if type(err) is ValueError else err
        if debug or usage is None:
            raise
        print(f"{PROG}: error: {_one_line(usage)}", file=sys.stderr)
        return 2 if isinstance(usage, UsageError) else 1
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
