"""Clean accuracy of a Hugging Face causal LM on cwlens's choice datasets, in plain
transformers (no TransformerLens): an independent check of ``cwlens accuracy`` and a
cheaper one (only the logits that are scored are computed).

The items are cwlens's own (``load_dataset``, with ``chat=`` the tokenizer's chat
template for ``--prompt chat``), scored as lm-eval does: continuation tokens split from
the encoded whole; the summed log-likelihood's argmax (first choice wins ties) against
the gold. Prints one JSON line per dataset with the exact 95% interval.

    python scripts/hf_clean_accuracy.py ~/.cache/cwlens/models/qwen2.5-coder-0.5b \
        --dataset mmlu,boolq --prompt chat
    python scripts/hf_clean_accuracy.py ~/.cache/cwlens/models/qwen2.5-coder-0.5b \
        --dataset winogrande
"""

import argparse
import json
import sys
import time
from collections import Counter

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cwlens.core.proportion import clopper_pearson
from cwlens.datasets import load_dataset


def ids_of(tok, text: str) -> list[int]:
    return tok(text).input_ids  # Qwen2 adds no BOS; other tokenizers add theirs here


@torch.no_grad()
def choice_lls(model, tok, item) -> list[float]:
    lls, seen = [], {}  # choices with the same input (MMLU, BoolQ) share one forward
    for context, continuation in item.pairs:
        spaces = len(context) - len(context.rstrip())  # lm-eval's _encode_pair
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        ctx, whole = ids_of(tok, context), ids_of(tok, context + continuation)
        cont = whole[len(ctx):]
        keep = len(cont)
        key = (tuple(whole[:-1]), keep)
        if key not in seen:
            logits = model(torch.tensor([whole[:-1]]), logits_to_keep=keep).logits[0]
            seen[key] = logits.double().log_softmax(-1)
        logp = seen[key]
        lls.append(float(logp[torch.arange(keep), torch.tensor(cont)].sum()))
    return lls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir")
    p.add_argument("--dataset", default="mmlu,boolq,winogrande")
    p.add_argument("--prompt", choices=("plain", "chat"), default="plain")
    p.add_argument("--n", type=int, default=None, help="first n items of each dataset")
    args = p.parse_args()
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).eval()

    def chat(user: str) -> str:
        return tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                       add_generation_prompt=True)

    for name in args.dataset.split(","):
        use_chat = args.prompt == "chat" and name in ("mmlu", "boolq")
        items = load_dataset(name, args.n, chat=chat if use_chat else None)
        t0, picks, correct = time.time(), [], 0
        for item in items:
            lls = choice_lls(model, tok, item)
            pick = max(range(len(lls)), key=lambda c: (lls[c], -c))
            picks.append(pick)
            correct += pick == item.gold
            if len(picks) % 10 == 0:
                print(f"{name}: {correct}/{len(picks)}", file=sys.stderr, flush=True)
        low, high = clopper_pearson(correct, len(items), 0.95)
        print(json.dumps({"dataset": name, "prompt": "chat" if use_chat else "plain",
                          "n": len(items), "correct": correct, "accuracy": correct / len(items),
                          "ci95": [low, high], "picks": dict(Counter(picks)),
                          "gold": dict(Counter(i.gold for i in items)),
                          "seconds": round(time.time() - t0)}), flush=True)


if __name__ == "__main__":
    main()
