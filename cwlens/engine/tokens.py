"""One text's token ids as the model itself makes them (:func:`token_ids`) and their
count (:func:`text_length`). Asks only the model's handle, so the input checks
(:mod:`cwlens.engine.validation`), the adapter and the batching can all use it."""

import torch

from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import ModelHandle


@takes_model
def token_ids(model: ModelLike, text: str, truncate: bool = True) -> torch.Tensor:
    """1-D token ids of one text, as the model itself would tokenize it. Decoders cut the
    text at the model's context length (``n_ctx``) unless ``truncate=False`` (texts longer
    than the model was trained on, for long-context runs); encoders never cut it here
    (:meth:`~cwlens.engine.handle.ModelHandle.token_ids`)."""
    return model.token_ids(text, truncate)


def text_length(handle: ModelHandle, text: str) -> int:
    """How many tokens the model makes of ``text`` (with its BOS / [CLS] ... [SEP]), not cut
    at the context as ``model.to_tokens`` and ``model(text)`` silently do."""
    return len(handle.token_ids(text, False))
