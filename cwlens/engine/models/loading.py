"""``load_model``: a TransformerLens model from a short name, a local directory or a hub id.

TransformerLens 4.x gives a ``TransformerBridge`` (raw Hugging Face weights unless
``compatibility_mode=True``, which folds LayerNorm and centres the writing weights: that
changes W_O and so the norms and cosines, not the model's function; the value biases
stay unfolded, in ``hook_v``, so the heads' outputs keep their b_V term). TransformerLens 3.x
gives a ``HookedTransformer`` loaded without weight processing (same raw geometry).
"""

import contextlib
import io
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from unittest import mock

import torch

from cwlens.core._types import Generation
from cwlens.engine.device_map import DEVICE_MAP_STRATEGIES, PlacementError, check_device_map
from cwlens.engine.handle import wrap
from cwlens.engine.models.gguf_local import dequantized_dir, packaged_dir
from cwlens.engine.models.hooked import load_hooked
from cwlens.engine.models.registry import MODELS, model_names
from cwlens.engine.pattern_seam import enable_pattern_edits
from cwlens.errors import (
    CwlensError,
    DeviceNotAvailableError,
    InvalidArgumentError,
    ModelNotAvailableError,
    UnknownOptionError,
)

DEFAULT_MODEL = "smollm2-135m"


def resolve(name_or_path: str) -> tuple[str, str]:
    """``(source, hub_id)``: source is a local directory or a hub id to load from."""
    if not name_or_path.strip():  # Path("") is ".", the working directory
        raise ModelNotAvailableError(
            f"The model name is empty ({name_or_path!r}): pass a short name, a local model "
            "directory or a hub id, one of: " + model_names())
    entry = MODELS.get(name_or_path.lower())
    if entry is not None:
        if entry.offline is not None:
            return str(dequantized_dir(name_or_path.lower(), entry.offline)), entry.hub_id
        if entry.offline_dir is not None:
            return str(packaged_dir(entry.offline_dir)), entry.hub_id
        return entry.hub_id, entry.hub_id
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelNotAvailableError(
                f"{path} is a file, not a model directory: pass the Hugging Face model "
                "directory that holds config.json and the weights (as written by "
                "save_pretrained), a hub id, or one of: " + model_names()
            )
        if not (path / "config.json").is_file():
            raise ModelNotAvailableError(
                f"{path} exists but has no config.json: pass a Hugging Face model directory "
                "(as written by save_pretrained), a hub id, or one of: " + model_names()
            )
        return str(path), str(path)
    if "/" not in name_or_path and name_or_path not in ("gpt2",):
        raise ModelNotAvailableError(
            f"Unknown model {name_or_path!r}: not a short name, not a local directory. "
            "Pass a hub id such as 'meta-llama/Llama-3.1-8B' (needs network), a local "
            "directory, or one of: " + model_names()
        )
    return name_or_path, name_or_path


def load_model(
    name_or_path: str | os.PathLike = DEFAULT_MODEL,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str = torch.float32,
    compatibility_mode: bool = False,
    generation: Generation = "auto",
    n_devices: int | None = None,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
    **options,
):
    """Load a TransformerLens model.

    Quiet by default: transformers' "Loading weights" bar and its warnings are silenced
    while it loads (``verbose=True`` shows them, as the ``cwlens`` command does). The one
    long step, the first use of an offline GGUF model (its conversion to float32, about
    30 s on a laptop CPU, once), says so in one line on stderr with a bar.

    Args:
        name_or_path: a short name (``"smollm2-135m"`` works offline; ``"llama-3.1-8b"``,
            ``"mistral-7b"``, ``"qwen3-8b"``, ``"deepseek-7b"``, ``"gpt2"``,
            ``"gemma-3-270m"`` load from the hub), a local HF directory or a hub id.
        device: ``"cpu"``, ``"cuda"``... (default: cuda if available).
        dtype: weights dtype, a floating ``torch.dtype`` or its name (``"bfloat16"``);
            cwlens computes its measures in float32 anyway.
        compatibility_mode: True or False. TransformerBridge only: fold LayerNorm and centre weights
            (value biases are kept in the heads: ``fold_value_biases=False``).
        generation: ``"bridge"`` (TransformerLens 4.x), ``"hooked"`` (3.x
            ``HookedTransformer``) or ``"auto"`` (bridge on 4.x, hooked on 3.x).
        n_devices: split the model over this many CUDA GPUs (``0..n-1``; TransformerBridge
            only). Under torchrun, :func:`cwlens.runs.distributed.placement` gives each rank its
            own group of GPUs instead (a ``device_map`` strategy with ``max_memory``).
        device_map: a Hugging Face device map (``"auto"``, ``"balanced"``,
            ``"sequential"``, or ``{module: device}``); exclusive with ``device``.
        max_memory: per-device budget for the device map (``{gpu index: bytes}``).
        verbose: (keyword) ``True`` shows transformers' and TransformerLens' own loading
            bars and messages; ``False`` (default) silences them.

    Returns:
        A ``TransformerBridge`` (TransformerLens 4.x) or a ``HookedTransformer`` (3.x), in
        eval mode, on ``device``.

    Raises:
        InvalidArgumentError: an argument of the wrong type or value (a name that is not a
            string or path, a dtype that is not floating, a ``compatibility_mode`` other than
            True/False, ...), before anything loads.
        PlacementError: ``device`` with ``device_map``, ``n_devices`` that is not an int
            >= 1 or more than the visible GPUs, a ``device_map`` that is not a strategy or
            a dict, ``max_memory`` that is not ``{device: size}`` or comes without a
            ``device_map``, or multi-device loading on TransformerLens 3.x.
        ModelNotAvailableError: a broken model directory, a hub id while offline, or a
            short name whose package is not installed (the message says what to install).

    Examples:
        >>> import tempfile
        >>> import cwlens
        >>> from cwlens.testing import save_tiny
        >>> with tempfile.TemporaryDirectory() as tmp:  # a local Hugging Face directory
        ...     model = cwlens.load_model(str(save_tiny("llama", tmp)), device="cpu")
        >>> logits, cache = cwlens.run_with_cache(model, "the cat sat")
        >>> logits.shape[:2]
        torch.Size([1, 4])
    """
    verbose = options.pop("verbose", False)
    if options:
        raise UnknownOptionError(f"load_model() got an unknown keyword {next(iter(options))!r}; "
                                 "beside its named arguments it takes verbose=True/False.")
    if not isinstance(verbose, bool):
        raise InvalidArgumentError(f"verbose must be True or False; got {verbose!r}.")
    if generation not in ("auto", "bridge", "hooked"):
        raise UnknownOptionError(
            f"generation must be 'auto', 'bridge' or 'hooked'; got {generation!r}"
        )
    if not isinstance(name_or_path, str | os.PathLike):
        raise InvalidArgumentError(
            f"name_or_path must be a model name (e.g. {DEFAULT_MODEL!r}) or a local folder; "
            f"got {type(name_or_path).__name__} {name_or_path!r}")
    name_or_path = os.fspath(name_or_path)  # a pathlib.Path works like its string
    if isinstance(dtype, str) and isinstance(getattr(torch, dtype, None), torch.dtype):
        dtype = getattr(torch, dtype)  # "float16", "bfloat16": the common spelling
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InvalidArgumentError(
            f"dtype must be a floating torch.dtype (torch.float32, torch.float16, "
            f"torch.bfloat16, or its name); got {dtype!r}")
    if not isinstance(compatibility_mode, bool):  # "no" would fold LayerNorm
        raise InvalidArgumentError(
            f"compatibility_mode must be True or False; got {compatibility_mode!r}.")

    cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    _check_placement_types(n_devices, device_map, max_memory, cuda_count)
    check_device_map(device_map, cuda_count, "device_map")
    multi = device_map is not None or (n_devices or 1) > 1 or max_memory is not None
    if device_map is not None and device is not None:
        raise PlacementError(f"device={device!r} and device_map are exclusive: pass one.")
    if n_devices is not None:
        if n_devices < 1:
            raise PlacementError(f"n_devices must be at least 1; got {n_devices}.")
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n_devices > 1 and n_devices > visible:
            raise PlacementError(f"n_devices={n_devices} needs {n_devices} CUDA GPUs; "
                                 f"{visible} are visible. Lower n_devices.")
        if n_devices > 1 and device is not None and str(device) != "cuda":
            raise PlacementError(f"n_devices={n_devices} picks the GPUs itself; pass device=None "
                                 f"or 'cuda', not {device!r}.")
    # multi-device: the bridge places the model (device and device_map are exclusive)
    placed_device = None if multi else str(check_device(device))
    with quiet_loading(not verbose):
        source, hub_id = resolve(name_or_path)
        return _load_resolved(source, hub_id, generation, placed_device, dtype, compatibility_mode,
                              (n_devices, device_map, max_memory), multi)


@contextmanager
def quiet_loading(quiet: bool = True) -> Iterator[None]:
    """Within the block, transformers draws no progress bar and logs errors only (its
    settings are put back after), and what TransformerLens 3.x prints ("Loaded pretrained
    model ...") is dropped; nothing changes when ``quiet`` is False."""
    if not quiet:
        yield
        return

    from transformers.utils import logging as hf_logging  # heavy: transformers, imported on use

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _load_resolved(source, hub_id, generation, placed_device, dtype, compatibility_mode,
                   placed: tuple, multi: bool):
    n_devices, device_map, max_memory = placed
    # a local directory needs no network: offline while it loads, then as it was (a process
    # setting left behind would also keep a later hub name offline)
    offline = os.path.isdir(source) and "HF_HUB_OFFLINE" not in os.environ
    with mock.patch.dict(os.environ, {"HF_HUB_OFFLINE": "1"} if offline else {}):
        # the multi-device placement, only what was given (the bridge's own keywords)
        placement = {k: v for k, v in (("n_devices", n_devices), ("device_map", device_map),
                                       ("max_memory", max_memory)) if v is not None}
        model = _load(source, hub_id, generation, placed_device, dtype, placement, multi,
                      compatibility_mode)
        wrap(model)  # the bound handle, made once
    return model


_SIZE = r"\d+(\.\d+)?\s*([KMGT]i?)?B"  # a Hugging Face memory size: "10GiB", "500MB", "1024B"


def _check_placement_types(n_devices: object, device_map: object, max_memory: object,
                           cuda_count: int) -> None:
    """Refuse a placement argument of the wrong type before anything loads (a string
    n_devices ended in a TypeError, a max_memory without a device map was ignored, a
    device map of the wrong type in an error blaming the model's files)."""
    if n_devices is not None and (isinstance(n_devices, bool) or not isinstance(n_devices, int)):
        raise PlacementError(
            f"n_devices must be a whole number of GPUs (an int >= 1) or None; got "
            f"{type(n_devices).__name__} {n_devices!r}" + (
                f": pass n_devices={int(n_devices)}." if isinstance(n_devices, str)
                and n_devices.strip().isdigit() else "."))
    strategies = ", ".join(map(repr, DEVICE_MAP_STRATEGIES))
    if isinstance(device_map, str) and device_map not in DEVICE_MAP_STRATEGIES:
        raise PlacementError(
            f"device_map={device_map!r} is not a strategy: pass one of {strategies}, or a dict "
            "{module name: device}.")
    if device_map is not None and not isinstance(device_map, str) and (
            not isinstance(device_map, dict) or not device_map
            or not all(isinstance(k, str) for k in device_map)):
        raise PlacementError(
            f"device_map must be one of {strategies} or a non-empty dict {{module name: device}}; "
            f"got {type(device_map).__name__} {device_map!r}.")
    if max_memory is None:
        return
    if device_map is None:
        raise PlacementError(
            "max_memory is the per-device budget of a device map, and no device_map was given: "
            f"pass device_map (one of {strategies}) with it, or leave max_memory out.")
    example = "e.g. {0: '20GiB', 1: '20GiB', 'cpu': '64GiB'}"
    if not isinstance(max_memory, dict) or not max_memory:
        raise PlacementError(f"max_memory must be a non-empty dict {{device: size}}, {example}; got "
                             f"{type(max_memory).__name__} {max_memory!r}.")
    for key, size in max_memory.items():
        gpu = isinstance(key, int) and not isinstance(key, bool) and 0 <= key
        if not (gpu or key in ("cpu", "disk", "mps")):
            raise PlacementError(f"max_memory key {key!r} is not a device: use a GPU index "
                                 f"(0..), 'cpu' or 'disk', {example}.")
        if gpu and key >= cuda_count:
            raise PlacementError(f"max_memory budgets GPU {key}, but this machine has "
                                 f"{cuda_count} CUDA GPU(s).")
        ok = (isinstance(size, int) and not isinstance(size, bool) and size > 0) or (
            isinstance(size, str) and re.fullmatch(_SIZE, size.strip(), re.IGNORECASE))
        if not ok:
            raise PlacementError(f"max_memory[{key!r}] = {size!r} is not a memory size: pass bytes "
                                 f"(an int > 0) or a size such as '20GiB' or '500MB', {example}.")


def _load(source, hub_id, generation, placed_device, dtype, placement, multi,
          compatibility_mode):
    if generation == "auto":
        generation = "bridge" if _has_bridge() else "hooked"
    try:
        if generation == "bridge":
            # heavy: transformer_lens, imported on use
            from transformer_lens.model_bridge import TransformerBridge

            model = TransformerBridge.boot_transformers(source, device=placed_device, dtype=dtype,
                                                        **placement)
            if compatibility_mode:
                # TL 4.3 folds b_V into b_O by default: hook_v would lose b_V and every head
                # output its term sum_j a_ij b_V = b_V. Keep it in the heads (as raw mode and
                # TL 3.x without processing do); W_O is still centred.
                model.enable_compatibility_mode(fold_value_biases=False)
            enable_pattern_edits(model)  # hook_pattern edits act on wrapped (BERT) attention too
            return model
        if multi:
            raise PlacementError(
                "n_devices / device_map need the TransformerBridge (TransformerLens 4.x); "
                "the 3.x HookedTransformer loads on one device here.")

        return load_hooked(source, hub_id, device=placed_device, dtype=dtype)
    except CwlensError:
        raise
    except Exception as err:  # transformers/torch/hub errors: one explained error
        raise ModelNotAvailableError(_load_failure(source, err)) from err


def _load_failure(source: str, err: Exception) -> str:
    """What went wrong loading ``source`` and what to do about it."""
    detail = (str(err).strip().splitlines() or [""])[0][:300]
    what = f"Could not load the model {source!r} ({type(err).__name__}: {detail})."
    if os.path.isdir(source):
        return (
            f"{what} The directory is not a complete Hugging Face model: it needs a valid "
            "config.json, the weights (*.safetensors or pytorch_model.bin) and the tokenizer "
            "files, as written by save_pretrained. Re-save or re-download it."
        )
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    return (
        f"{what} It is not a local directory, so it is fetched from the Hugging Face hub: "
        "check the id"
        + (", and unset HF_HUB_OFFLINE (it is set, so nothing is downloaded)" if offline
           else ", your network, and for gated models `huggingface-cli login`")
        + ". Or pass a local directory or one of: " + model_names()
    )


def check_device(device: str | torch.device | None) -> torch.device:
    """The device to load on (default: cuda if available), refusing unknown strings and
    devices this machine does not have, before anything is loaded."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, torch.device):
        dev = device
    else:
        try:
            dev = torch.device(str(device))
        except (RuntimeError, ValueError) as err:
            raise DeviceNotAvailableError(
                f"Unknown device {device!r}: pass cpu, cuda, cuda:N (N a GPU index) or mps."
            ) from err
    if dev.type == "cpu":
        if dev.index not in (None, 0):  # torch accepts cpu:1 and runs it on the one CPU device
            raise DeviceNotAvailableError(
                f"device {str(device)!r}: there is one CPU device (cpu, cpu:0); torch would "
                "run cpu:N on it all the same. Pass --device cpu (device='cpu').")
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build of torch" if torch.version.cuda is None else "no GPU visible"
            raise DeviceNotAvailableError(
                f"device {str(device)!r} asked for a CUDA GPU, but this machine has none "
                f"({build}). Pass --device cpu (device='cpu'), or install a CUDA build of torch."
            )
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise DeviceNotAvailableError(
                f"device {str(device)!r}: this machine has {count} CUDA GPU(s), cuda:0.."
                f"cuda:{count - 1}."
            )
        return dev
    if dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceNotAvailableError(
                f"device {str(device)!r}: Apple MPS is not available here; pass cpu or cuda."
            )
        return dev
    raise DeviceNotAvailableError(
        f"Unsupported device {str(device)!r}: pass cpu, cuda, cuda:N or mps."
    )


def _has_bridge() -> bool:
    """TransformerLens >= 4 (where HookedTransformer is gone and the bridge is the API).

    3.x releases ship an early bridge too, but their main API is HookedTransformer.
    """
    try:
        major = int(version("transformer-lens").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return False
    return major >= 4
