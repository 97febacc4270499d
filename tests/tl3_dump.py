"""Run by tests/test_cross_version.py with .venv-tl3's python (TransformerLens 3.x).

usage: python tests/tl3_dump.py OUT.pt DIR [DIR ...]
Loads each tiny model directory as a HookedTransformer/HookedEncoder, runs the padded
batch of tests/test_cross_version.TEXTS and saves the weights cwlens computes.
"""

import sys

import torch

import cwlens
from cwlens.engine.batching import pad_batch

TEXTS = ["the cat sat on the mat", "mary gave john a bottle of milk ."]


def dump(directory: str) -> dict:
    model = cwlens.load_model(directory, device="cpu", generation="hooked")
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask)
    return {
        "class": type(model).__name__,
        "tokens": tokens,
        "mask": mask,
        "inter": cwlens.contribution_weights(cache, model, attention_mask=mask),
        "intra": cwlens.contribution_weights(cache, model, kind="intra", attention_mask=mask),
        "value_weighted": cwlens.importance(cache, model, metric="value_weighted", attention_mask=mask),
        "post_attn_norm": cwlens.engine.adapter.ModelInfo.of(model).post_attn_norm,
        "residual_problems": cwlens.wrap(model).residual_problems(),
    }


if __name__ == "__main__":
    out, *dirs = sys.argv[1:]
    torch.save({d: dump(d) for d in dirs}, out)
