"""One text's token ids as the model itself makes them (:func:`token_ids`) and their
count (:func:`text_length`). Asks only the model's handle, so the input checks
(:mod:`cwlens.engine.validation`), the adapter and the batching can all use it."""

import torch

from cwlens.engine.handle import wrap


def token_ids(model, text: str, truncate: bool = True) -> torch.Tensor:
    """1-D token ids of one text, as the model itself would tokenize it. Decoders cut the
    text at the model's context length (``n_ctx``) unless ``truncate=False`` (texts longer
    than the model was trained on, for long-context runs); encoders never cut it here."""
    handle = wrap(model)
    if handle.is_encoder:  # [CLS] ... [SEP] from the tokenizer (to_tokens differs by version)
        return torch.tensor(handle.tokenizer(text)["input_ids"])
    # truncate=True is to_tokens' own default: only the non-default is passed (models and
    # stubs whose to_tokens has no such keyword still work)
    extra = {} if truncate else {"truncate": False}
    return handle.to_tokens(text, move_to_device=False, **extra)[0].cpu()


def text_length(model, text: str) -> int:
    """How many tokens ``model`` makes of ``text`` (with its BOS / [CLS] ... [SEP]), not cut
    at the context as ``model.to_tokens`` and ``model(text)`` silently do."""
    return len(token_ids(model, text, truncate=False))
