"""Models of a known shape with random weights: for timing and memory benchmarks that need
no download (``scripts/benchmark.py --random-config llama-3.1-8b``).

The weights are the architecture's own random initialisation, so the numbers such a model
gives mean nothing; its cost (forward pass, attention patterns, cwlens on top) is that of
the real model of the same shape.
"""

import json
import tempfile
from pathlib import Path

import torch

from cwlens.errors import UnknownOptionError

# Hugging Face LlamaConfig fields of the shapes used in the paper's experiments
SHAPES: dict[str, dict] = {
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                         max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                         max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5),
    "tiny-llama": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                       max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5),
}


def random_model(shape: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                 n_layers: int | None = None, seed: int = 0):
    """A ``TransformerBridge`` of ``shape`` (a key of :data:`SHAPES`) with random weights,
    built directly on ``device`` in ``dtype`` (an 8B model in bf16 needs 16 GB there).

    ``n_layers`` overrides the depth (e.g. 1 to time one layer of a big model)."""
    if shape not in SHAPES:
        raise UnknownOptionError(f"Unknown shape {shape!r}. Known: {', '.join(sorted(SHAPES))}.")
    # heavy: transformer_lens, transformers, imported on use
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = dict(SHAPES[shape])
    if n_layers is not None:
        fields["num_hidden_layers"] = int(n_layers)
    config = LlamaConfig(**fields, tie_word_embeddings=False)
    config._attn_implementation = "eager"  # the bridge reads patterns from eager attention
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)
        with torch.device(device):
            hf = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    # the bridge reads the config and tokenizer from a folder while it boots, not after:
    # a temporary one, removed on return (one was left in the temp dir by every call)
    with tempfile.TemporaryDirectory(prefix=f"cwlens-random-{shape}-") as tmp:
        folder = Path(tmp)
        config.save_pretrained(folder)
        _write_tokenizer(folder, config.vocab_size)
        return TransformerBridge.boot_transformers(str(folder), hf_model=hf, device=device, dtype=dtype)


def _write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A word-level tokenizer over ``vocab_size`` made-up tokens (random models read ids)."""
    from tokenizers import Tokenizer, models, pre_tokenizers  # heavy: transformers, imported on use
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2",
                                   unk_token="t0", pad_token="t2")
    fast.save_pretrained(folder)
    (folder / "cwlens_random.json").write_text(json.dumps({"random_weights": True}))
