"""Next-token NLL of long inputs in chunks (cwlens.engine.lm): the forward stops
before the unembedding and the logits are made a few positions at a time. Equal to the
NLL of the full logits (float64 reference from the definition), on every tiny decoder,
a Gemma-3 with its final logit soft cap, padded batches and chunks of 1, 3 and n; and no
``[n, vocab]`` tensor is ever made."""

import pytest
import torch
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode

from cwlens.datasets import ChoiceItem, TextSample
from cwlens.engine import lm
from cwlens.engine.batching import pad_batch
from cwlens.engine.handle import wrap
from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness
from cwlens.testing import ARCHITECTURES, tiny_model

DECODERS = [a for a in ARCHITECTURES if a != "bert"]
TEXTS = ["the cat sat on the mat and the dog ran fast to the big red house .",
         "mary gave john a bottle of milk .",
         "one two three"]
SOFT_CAP = 0.2  # small: most logits of the tiny model are capped, so a missing cap shows


def softcap_model(directory):
    """The tiny Gemma-3 with a final logit soft cap (``cap * tanh(x / cap)``)."""
    from cwlens.engine.models.loading import load_model
    from cwlens.testing import tiny_hf_model

    hf, tok = tiny_hf_model("gemma3")
    hf.config.final_logit_softcapping = SOFT_CAP
    path = directory / "tiny-gm3-softcap"
    hf.save_pretrained(path)
    tok.save_pretrained(path)
    return load_model(str(path), device="cpu")


@pytest.fixture(scope="module", params=[*DECODERS, "gemma3-softcap"])
def model(request, tmp_path_factory):
    if request.param == "gemma3-softcap":
        return softcap_model(tmp_path_factory.mktemp("softcap"))
    return tiny_model(request.param)


def test_the_soft_capped_gemma_is_capped(tmp_path):
    capped, plain = softcap_model(tmp_path), tiny_model("gemma3")
    tokens, mask = pad_batch(plain, TEXTS)
    with torch.no_grad():
        want, got = plain(tokens, attention_mask=mask), capped(tokens, attention_mask=mask)
    assert want.abs().max() > 2 * SOFT_CAP  # the cap bites (same weights, same seed)
    assert_close(got, SOFT_CAP * torch.tanh(want / SOFT_CAP), rtol=0, atol=1e-6)


def reference_nll(logits, tokens, mask):
    """From the definition, in float64: -log softmax(logits)[next token] on real pairs."""
    logp = torch.log_softmax(logits.double(), -1)[:, :-1]
    nll = -logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    real = mask.bool()
    return torch.where(real[:, 1:] & real[:, :-1], nll, 0.0)


def deferred_forward(model, tokens, mask, chunk):
    with torch.no_grad(), lm.deferred_logits(wrap(model), chunk) as output:
        logits = model(tokens, attention_mask=mask)
    assert logits.shape[1] == 0  # the unembedding made no positions
    return output(logits)


@pytest.mark.parametrize("chunk", [1, 3, None])
def test_chunked_nll_equals_full_logits_nll(model, chunk):
    tokens, mask = pad_batch(model, TEXTS)
    assert not mask.all()  # padded
    with torch.no_grad():
        logits = model(tokens, attention_mask=mask)
    out = deferred_forward(model, tokens, mask, chunk or tokens.shape[1])
    assert_close(wrap(model).logits_of(out.residual), logits, rtol=0, atol=1e-5)
    nll, is_target = lm.token_nll(out, tokens, mask)
    want = reference_nll(logits, tokens, mask)
    assert_close(nll.double(), want, rtol=0, atol=2e-5)
    full_nll, full_target = lm.token_nll(logits, tokens, mask)
    assert torch.equal(is_target, full_target)
    assert_close(nll, full_nll, rtol=0, atol=2e-5)
    for got, full in zip(lm.document_scores(out, tokens, mask),
                         lm.document_scores(logits, tokens, mask), strict=True):
        assert got["n_tokens"] == full["n_tokens"]
        assert got["nll"] == pytest.approx(full["nll"], abs=1e-5)


def test_logits_at_reads_the_same_rows(model):
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        logits = model(tokens, attention_mask=mask)
    out = deferred_forward(model, tokens, mask, 3)
    positions = torch.arange(4, 9)
    assert_close(lm.logits_at(out, 1, positions), logits[1, 4:9], rtol=0, atol=1e-5)
    assert_close(lm.rows(out, 1, 3).residual, out.residual[1:3])


class LargestVocabTensor(TorchDispatchMode):
    """Records, over every tensor an op returns, the most positions a ``[..., vocab]``
    tensor holds (the product of its leading dims), leaving out the weights' own shape."""

    def __init__(self, vocab: int, weight_shapes):
        super().__init__()
        self.vocab, self.weights, self.most = vocab, {tuple(s) for s in weight_shapes}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.ndim >= 2 and t.shape[-1] == self.vocab \
                    and tuple(t.shape) not in self.weights:
                self.most = max(self.most, t[..., 0].numel())
        return out


def test_the_chunked_path_never_makes_pos_by_vocab_logits():
    model = tiny_model("llama")
    handle = wrap(model)
    W_U, _ = handle.unembed()
    weights = [W_U.shape, W_U.T.shape]
    tokens, mask = pad_batch(model, [" ".join(["the cat sat on the mat"] * 8)] * 2)
    b, n = tokens.shape
    assert n > 40
    probe = LargestVocabTensor(handle.d_vocab, weights)
    with probe:
        lm.token_nll(deferred_forward(model, tokens, mask, 3), tokens, mask)
    assert 0 < probe.most <= b * 3
    full = LargestVocabTensor(handle.d_vocab, weights)  # the probe sees the whole logits
    with full, torch.no_grad():
        lm.token_nll(model(tokens, attention_mask=mask), tokens, mask)
    assert full.most >= b * (n - 1)


DOCS = [TextSample("d-0", TEXTS[0], "toy"), TextSample("d-1", TEXTS[1], "toy"),
        TextSample("d-2", TEXTS[2], "toy")]
ITEMS = [ChoiceItem("t-0", ("the cat sat on the",) * 3, (" mat", " dog ran", " red"), 1, "toy"),
         ChoiceItem("t-1", ("paris is the capital of", "london is the capital of"),
                    (" france .", " france ."), 0, "toy")]


@pytest.mark.parametrize("data, attention", [("docs", "eager"), ("items", "eager"),
                                             ("docs", "blockwise")])
def test_the_sweep_scores_the_same_in_chunks(monkeypatch, data, attention):
    """The whole harness (clean streamed pass + masked passes) on the chunked path, with
    the model's attention or blockwise (as every input above the threshold runs)."""
    import cwlens.engine.streaming

    model = tiny_model("llama")
    cfg = FaithfulnessConfig(metrics=("contribution", "random"), rates=(0.3, 1.0), batch_tokens=60)
    samples = DOCS if data == "docs" else ITEMS
    full = run_faithfulness(model, samples, cfg, progress=False).table
    blockwise_runs = []
    if attention == "blockwise":  # attention="auto" then runs blockwise at every length
        from cwlens.engine.models import blockwise

        monkeypatch.setattr(cwlens.engine.streaming, "AUTO_THRESHOLD", 0)
        real_context = blockwise.blockwise_attention
        monkeypatch.setattr(blockwise, "blockwise_attention",
                            lambda *a, **k: blockwise_runs.append(1) or real_context(*a, **k))
    monkeypatch.setattr(lm, "CHUNKED_ABOVE", 0)
    monkeypatch.setattr(lm, "CHUNK", 3)
    seen = []
    real = lm.Unembedded.logits

    def spy(self, start, stop):
        seen.append(stop - start)
        return real(self, start, stop)

    monkeypatch.setattr(lm.Unembedded, "logits", spy)
    picked = []  # multiple choice unembeds only its continuation positions (lm.Picked)
    real_picked = lm.Picked.of.__func__

    def spy_picked(cls, out, pairs):
        picked.append(isinstance(out, lm.Unembedded))
        return real_picked(cls, out, pairs)

    monkeypatch.setattr(lm.Picked, "of", classmethod(spy_picked))
    chunked = run_faithfulness(model, samples, cfg, progress=False).table
    if data == "docs":
        assert seen and max(seen) <= 3  # the sweep went the chunked way
    else:  # every pass kept the residual (no whole logits) and unembedded the picked positions
        assert picked and all(picked) and not seen
    assert bool(blockwise_runs) == (attention == "blockwise")  # clean + masked passes
    keys = ["metric", "mode", "rate", "sample_id", "measure"]
    a, b = full.set_index(keys)["value"].sort_index(), chunked.set_index(keys)["value"].sort_index()
    assert a.index.equals(b.index)
    for measure in a.index.unique("measure"):  # ΔPPL: a difference of PPLs (~ the vocab size)
        atol = 2e-6 * float(a.xs("ppl", level="measure").abs().max()) if "ppl" in measure else 1e-5
        assert_close(torch.tensor(b.xs(measure, level="measure").values),
                     torch.tensor(a.xs(measure, level="measure").values), rtol=0, atol=atol)


def test_the_sink_intervention_scores_the_same_in_chunks(monkeypatch):
    from cwlens.sinks import sink_norm_intervention

    model = tiny_model("qwen3")
    tokens, mask = pad_batch(model, TEXTS)
    full, _ = sink_norm_intervention(model, tokens, mask, scales=(0.0,))
    monkeypatch.setattr(lm, "CHUNKED_ABOVE", 0)
    monkeypatch.setattr(lm, "CHUNK", 3)
    chunked, _ = sink_norm_intervention(model, tokens, mask, scales=(0.0,))
    assert chunked["n_tokens"].tolist() == full["n_tokens"].tolist()
    assert_close(torch.tensor(chunked["nll_sum"].values), torch.tensor(full["nll_sum"].values),
                 rtol=1e-6, atol=1e-5)
