"""Every error cwlens raises on purpose derives from :class:`CwlensError`.

Each message names the problem, the value that caused it, the valid options and the fix.
They subclass the matching builtin too (``KeyError``, ``ValueError``, ...), so existing
``except ValueError`` code keeps working.
"""


class CwlensError(Exception):
    """Base class of all cwlens errors."""


class MissingHookError(CwlensError, KeyError):
    """The activation cache lacks a hook that the computation needs."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class LayerOutOfRangeError(CwlensError, IndexError):
    """A layer index outside ``[0, n_layers)``."""


class UnknownOptionError(CwlensError, ValueError):
    """An option string (metric, kind, scope, ...) that is not one of the valid choices."""


class ShapeMismatchError(CwlensError, ValueError):
    """Tensors whose shapes do not fit together, e.g. a cache from another model."""


class NonFiniteError(CwlensError, FloatingPointError):
    """NaN or inf in the activations (often fp16 overflow)."""


class ModelNotAvailableError(CwlensError, RuntimeError):
    """A model cannot be found or loaded; the message says what to install or pass."""


class DatasetFormatError(CwlensError, ValueError):
    """A dataset file with a malformed line; the message names file and line."""


class InterventionNotAppliedError(CwlensError, RuntimeError):
    """An intervention hook that has no effect on this model (its edits would be dropped)."""


class UnsupportedModelError(CwlensError, ValueError):
    """A computation that does not apply to this kind of model (e.g. next-token loss on an encoder)."""


class InvalidArgumentError(CwlensError, ValueError):
    """A value outside what an option accepts (a negative count, a rate above 1, ...)."""


class EmptyInputError(InvalidArgumentError):
    """An input with nothing in it: an empty text, zero tokens, an empty list of texts."""


class InputTooLongError(InvalidArgumentError):
    """An input longer than the model's context (``n_ctx``): see docs/inputs.md for what
    each surface does with one (the API refuses; ``max_tokens`` surfaces truncate)."""


class UsageError(InvalidArgumentError):
    """An option that cannot apply to this model (e.g. ``--past-context`` on a model with
    learned position embeddings): the command line exits 2, as for argparse's usage errors."""


class DeviceNotAvailableError(InvalidArgumentError):
    """A device string torch does not know, or a device this machine does not have."""


class OutputPathError(CwlensError, OSError):
    """An output path that cannot be written: a folder where a file is expected, a file
    where a folder is expected, or a location without write permission."""


class CwlensWarning(UserWarning):
    """Something cwlens did on the user's behalf that changes the result (e.g. a text cut
    to the model's context); the command line prints it as one ``cwlens: note:`` line."""


class BlockwiseHookError(CwlensError, RuntimeError):
    """A hook that needs a whole ``[batch, head, n, n]`` attention tensor (``hook_pattern``,
    ``hook_attn_scores``) on a forward pass that computes attention in query blocks."""
