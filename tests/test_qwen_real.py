"""Acceptance tier, opt-in: the real Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF -> float32),
and the 1.5B (``scripts/setup.sh --qwen15``; the one offline model above chance on MMLU),
a Qwen2 decoder with biases on the query, key and value projections (no other offline
model has them), GQA 7:1 and a chat template. Skipped with the reason when the weights
are not installed (``scripts/setup.sh --qwen``)."""

import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens.datasets import load_dataset
from cwlens.engine import adapter, reducers
from cwlens.engine.handle import wrap

pytestmark = pytest.mark.slow
CHATML = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
          "assistant.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")


def next_token(model, text: str) -> tuple[str, float]:
    tokens = model.to_tokens(text)
    with torch.no_grad():
        logp = model(tokens)[0, -1].log_softmax(-1)
    top = int(logp.argmax())
    return model.tokenizer.decode([top]), float(logp[top])


def test_loads_as_qwen2_with_qkv_biases(qwen05):
    info = adapter.ModelInfo.of(qwen05)
    assert (info.n_layers, info.n_heads) == (24, 14)
    hf = qwen05.original_model.model.layers[0].self_attn
    for proj in (hf.q_proj, hf.k_proj, hf.v_proj):
        assert proj.bias is not None and float(proj.bias.detach().abs().max()) > 0.1
    assert hf.o_proj.bias is None
    # no BOS: Qwen2 is trained without one, and TransformerLens does not add it
    assert qwen05.to_tokens("The capital of France is")[0].tolist() == [785, 6722, 315, 9625, 374]


def test_knows_a_capital_plain_and_in_its_chat_template(qwen05):
    word, logp = next_token(qwen05, "The capital of France is")
    assert word == " Paris" and logp > -0.2  # measured -0.10 (transformers on the same weights)
    prompt = wrap(qwen05).chat_prompt("What is the capital of France? Answer with one word.")
    assert prompt == CHATML.format("What is the capital of France? Answer with one word.")
    assert next_token(qwen05, prompt)[0] == "Paris"


def test_chat_items_score_the_assistants_first_token(qwen05):
    """An MMLU chat item: cwlens's per-choice log-likelihoods (lm-eval's split: the
    template's last newline moves into the continuation) differ from the next-token
    log-probabilities of "A".."D" after the assistant header by one shared term."""
    from cwlens.faithfulness.choice import encode_items

    item = load_dataset("mmlu", n=1, chat=lambda u: wrap(qwen05).chat_prompt(u))[0]
    requests = encode_items(wrap(qwen05), [item])
    assert len({r.input_ids for r in requests}) == 1  # one forward row for the 4 letters
    tokens = qwen05.to_tokens(item.contexts[0])  # the prompt, ending in "assistant\n"
    assert tokens[0].tolist() == list(requests[0].input_ids)
    with torch.no_grad():
        logp = qwen05(tokens)[0].log_softmax(-1).double()
    newline = requests[0].continuation_ids[0]
    assert qwen05.tokenizer.decode([newline]) == "\n"
    for r, c in zip(requests, "ABCD", strict=True):
        letter = qwen05.tokenizer.convert_tokens_to_ids(c)
        assert r.continuation_ids == (newline, letter) and r.start == tokens.shape[1] - 2
        ll = float(logp[r.start, newline] + logp[r.start + 1, letter])
        assert ll - float(logp[-2, newline]) == pytest.approx(float(logp[-1, letter]), abs=1e-9)


def blockwise_equals_eager(model, last_layer: int) -> None:
    if not wrap(model).supports_blockwise:
        pytest.skip("the blockwise path applies to TransformerLens 4.x bridges only")
    torch.manual_seed(0)
    tokens = torch.randint(1000, 20000, (1, 300))
    layers = [0, last_layer]
    rs = lambda: [reducers.ColumnSums("contribution")]  # noqa: E731
    eager = cwlens.stream_reduce(model, tokens, rs(), layers=layers, attention="eager")
    block = cwlens.stream_reduce(model, tokens, rs(), layers=layers, attention="blockwise",
                                 query_block=64)
    assert_close(block.logits, eager.logits, rtol=0, atol=1e-4)
    assert_close(block["column_sums_contribution"].tensor, eager["column_sums_contribution"].tensor,
                 rtol=1e-3, atol=1e-3)


def test_blockwise_equals_eager(qwen05):
    blockwise_equals_eager(qwen05, 23)


def test_qwen15_loads_knows_a_capital_and_blockwise_equals_eager(qwen15):
    info = adapter.ModelInfo.of(qwen15)
    assert (info.n_layers, info.n_heads) == (28, 12)
    q_proj = qwen15.original_model.model.layers[0].self_attn.q_proj
    assert q_proj.bias is not None and float(q_proj.bias.detach().abs().max()) > 0.1
    word, logp = next_token(qwen15, "The capital of France is")
    assert word == " Paris"
    blockwise_equals_eager(qwen15, 27)
