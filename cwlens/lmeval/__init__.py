"""lm-eval-harness under masking: the ``cwlens-masked`` model and offline tasks.

Optional extra: ``pip install cwlens[lmeval]``. Nothing here imports lm-eval until
:func:`register` (or ``python -m cwlens.lmeval``) runs, so ``import cwlens`` never needs it.

    python -m cwlens.lmeval --model cwlens-masked \\
        --model_args pretrained=smollm2-135m,metric=contribution,mode=comprehensiveness,rate=0.3 \\
        --tasks cwlens_boolq --limit 20

``python -m cwlens.lmeval`` is the ``lm_eval`` command with ``cwlens-masked`` registered and
:func:`task_dir` on the include path (lm-eval has no plugin entry point, so a bare
``lm_eval`` does not know the model). From Python::

    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    import cwlens.lmeval

    cwlens.lmeval.register()
    simple_evaluate(model="cwlens-masked", model_args="pretrained=smollm2-135m,metric=...",
                    tasks=["cwlens_boolq"],
                    task_manager=TaskManager(include_path=cwlens.lmeval.task_dir()))

The tasks ``cwlens_mmlu``, ``cwlens_winogrande`` and ``cwlens_boolq`` read the shipped
samples (``cwlens/datasets/data``) with the prompts of :mod:`cwlens.datasets.tasks`, so
their requests are exactly those of ``cwlens faithfulness`` on the same items.
"""

import importlib.util
from pathlib import Path

from cwlens.errors import CwlensError

TASKS = ("cwlens_mmlu", "cwlens_winogrande", "cwlens_boolq")
MODEL_NAME = "cwlens-masked"


def task_dir() -> str:
    """The folder of the task YAMLs, for lm-eval's ``--include_path``."""
    return str(Path(__file__).resolve().parent / "tasks")


def require_lm_eval() -> None:
    """Raise a :class:`~cwlens.errors.CwlensError` naming the install if lm-eval is missing."""
    if importlib.util.find_spec("lm_eval") is None:
        raise CwlensError(
            "cwlens.lmeval needs lm-evaluation-harness: pip install 'cwlens[lmeval]' "
            "(or pip install 'lm-eval>=0.4.8')."
        )


def register():
    """Register ``cwlens-masked`` with lm-eval's model registry; returns the class."""
    require_lm_eval()
    # here, not at the top: cwlens.lmeval.model imports this module and lm_eval (optional)
    from cwlens.lmeval.model import CwlensMaskedLM

    return CwlensMaskedLM


__all__ = ["MODEL_NAME", "TASKS", "register", "require_lm_eval", "task_dir"]
