"""``python -m cwlens.lmeval`` (or ``cwlens-lm-eval``): the ``lm_eval`` command with the
``cwlens-masked`` model registered and the cwlens task folder on the include path.

Arguments are lm-eval's own; ``--include_path task_dir()`` is added (unless given) so
``--tasks cwlens_boolq`` resolves. Dataset downloads are switched
off (``HF_DATASETS_OFFLINE=1`` unless set): the cwlens tasks read shipped files.
"""

import os
import sys


def with_task_dir(argv: list[str], folder: str) -> list[str]:
    """``argv`` plus ``--include_path folder``, unless an include path is given (lm-eval
    takes one folder there: copy the cwlens YAMLs and ``cwlens_tasks.py`` into yours)."""
    if any(a == "--include_path" or a.startswith("--include_path=") for a in argv):
        return list(argv)
    return [*argv, "--include_path", folder]


def main(argv: list[str] | None = None) -> None:
    from cwlens.lmeval import register, task_dir

    register()
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] not in ("-h", "--help"):
        args = with_task_dir(args, task_dir())
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *args]
    cli_evaluate()


if __name__ == "__main__":
    main()
