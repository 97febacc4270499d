"""Multiple-choice requests split the encoded context + continuation as lm-eval does.

lm-eval-harness (``_encode_pair``): trailing whitespace moves from the context to the
continuation; ``whole = encode(context + continuation)``, ``context_enc =
encode(context)``, ``continuation_enc = whole[len(context_enc):]``. Tokenizing the
continuation alone differs wherever tokens merge across the boundary.
"""

from types import SimpleNamespace

import torch

from cwlens.datasets import ChoiceItem
from cwlens.engine.handle import wrap
from cwlens.faithfulness.choice import encode_items, encode_pair


class _Model:
    """A decoder stub around a tokenizer: BOS + the tokenizer's ids, like ``to_tokens``."""

    def __init__(self, tokenizer, bos: int):
        self.tokenizer, self.bos = tokenizer, bos
        self.cfg = SimpleNamespace(attention_dir="causal", n_layers=1, n_heads=1, d_model=1, d_head=1)

    def run_with_hooks(self, *args, **kwargs):  # (the hooks API that makes it a model to cwlens.wrap)
        raise NotImplementedError

    hooks = run_with_hooks

    def to_tokens(self, text, move_to_device=False, truncate=True):  # (no context: never cut)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return torch.tensor([[self.bos, *ids]])


class _MergingTokenizer:
    """Characters, except that "ab" is one token (id 99): merges across a boundary."""

    def __call__(self, text, add_special_tokens=False):
        ids, i = [], 0
        while i < len(text):
            if text[i : i + 2] == "ab":
                ids.append(99)
                i += 2
            else:
                ids.append(ord(text[i]))
                i += 1
        return {"input_ids": ids}


def test_continuation_is_split_from_the_whole_encoding():
    model = _Model(_MergingTokenizer(), bos=1)
    ctx, cont = encode_pair(wrap(model), "xa", "bc")
    assert ctx == [1, ord("x"), ord("a")]
    assert cont == [ord("c")]  # whole = [1, x, ab, c]: lm-eval's slice, not encode("bc")


def test_trailing_space_moves_to_the_continuation():
    model = _Model(_MergingTokenizer(), bos=1)
    ctx, cont = encode_pair(wrap(model), "q: ", "z")
    assert ctx == [1, ord("q"), ord(":")]
    assert cont == [ord(" "), ord("z")]


def test_smollm2_tokenizer_trailing_space(smollm2):
    """On the real SmolLM2 tokenizer (the fixture converts the model on a fresh machine, so
    this runs in CI rather than only where an earlier run left the converted files)."""
    tok = smollm2.tokenizer
    model = _Model(tok, bos=tok.bos_token_id)
    item = ChoiceItem(id="t-0000", dataset="t", contexts=("Answer: ", "Answer: "),
                      continuations=("Paris", "London"), gold=0)
    requests = encode_items(wrap(model), [item])
    paris = tok(" Paris", add_special_tokens=False)["input_ids"]
    assert list(requests[0].continuation_ids) == paris  # " Paris", not "Paris" after " "
    assert tok("Paris", add_special_tokens=False)["input_ids"] != paris
    ctx = [tok.bos_token_id, *tok("Answer:", add_special_tokens=False)["input_ids"]]
    assert list(requests[0].input_ids) == (ctx + paris)[:-1]
    assert requests[0].start == len(ctx) - 1
