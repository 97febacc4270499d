"""Small C kernels for the CPU, compiled on first use with the system's C compiler.

:func:`row_topk` ranks each row of a block of attention measures in one pass
(``row_topk.c``): the streamed pass's top-k lists on the CPU, where ``torch.topk`` costs
~10 ns a key. The source is compiled once per machine (``cc -O3 -march=native``, a few
tenths of a second) into ``$CWLENS_CACHE`` (default ``~/.cache/cwlens``)/native, named by
a hash of the source, the flags and the CPU's features, so that a home folder shared by
different machines never loads another CPU's build. Where no compiler is found, the build
fails, or ``CWLENS_NATIVE=0`` is set, :func:`available` is False and cwlens ranks with
torch (same values; tests run both: ``tests/test_native_topk.py``).
"""

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("row_topk.c")
# -ffinite-math-only -fno-signed-zeros: the chunk maxima vectorise (5x faster); the values
# ranked are finite (cwlens checks every measure it ranks, and a <= 1 times a finite norm)
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-ffinite-math-only",
         "-fno-signed-zeros", "-shared", "-fPIC", "-pthread")
_state: dict[str, object] = {}


def _cpu_features() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def _cache_dir() -> Path:
    return Path(os.environ.get("CWLENS_CACHE") or Path.home() / ".cache" / "cwlens") / "native"


def _build() -> ctypes.CDLL | None:
    if os.environ.get("CWLENS_NATIVE", "1") == "0":
        return None
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        return None
    source = SOURCE.read_bytes()
    tag = hashlib.sha256(b"\0".join([source, " ".join(FLAGS).encode(), platform.machine().encode(),
                                     _cpu_features().encode()])).hexdigest()[:16]
    target = _cache_dir() / f"row_topk-{tag}.so"
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                built = Path(tmp) / target.name
                subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(built), "-lm"], check=True,
                               capture_output=True, timeout=120)
                os.replace(built, target)  # atomic: processes building at once never see half a file
        lib = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError):
        return None
    fn = lib.cwlens_row_topk
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    fn.argtypes = [p, i64, i64, i64, p, i64, i64, p, p, i64, i32, i32, p, p, i32]
    fn.restype = i32
    return lib


def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None (no compiler, a failed build, ``CWLENS_NATIVE=0``)."""
    if "lib" not in _state:
        _state["lib"] = _build()
    return _state["lib"]  # type: ignore[return-value]


def available() -> bool:
    return library() is not None


def row_topk(x: torch.Tensor, k: int, by_abs: bool = False, scale: torch.Tensor | None = None,
             lo: torch.Tensor | None = None, hi: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` keys of each row of ``x`` ``[..., q, width]`` (float32, CPU): ``(indices
    int32, ranked values)`` ``[..., q, k]``, largest first, equal values in key order.

    ``scale`` ``[..., width]`` (one row per ``q`` rows of ``x``): rank ``x * scale``
    without making it. ``lo``/``hi`` ``[q]`` (int64): query ``i`` ranks keys
    ``lo[i] <= j < hi[i]`` only; a row with fewer than ``k`` such keys ends in index -1,
    value NaN. ``by_abs``: rank ``|.|`` (the values returned are then ``|.|``). The values
    must be finite (the kernel is built with ``-ffinite-math-only``): cwlens checks every
    measure before it gets here and sends a metric of one's own with NaN or inf to torch."""
    lib = library()
    if lib is None:
        raise RuntimeError("cwlens.engine.native: no compiled kernels (see available())")
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"row_topk takes a float32 CPU tensor; got {x.dtype} on {x.device}")
    x = x.contiguous()
    *lead, q, width = x.shape
    k = max(int(k), 0)
    n_rows = x.numel() // width if width else 0
    idx = torch.full((*lead, q, k), -1, dtype=torch.int32)
    val = torch.full((*lead, q, k), float("nan"), dtype=torch.float32)
    if n_rows == 0 or k == 0:
        return idx, val
    s_ptr, s_stride = None, 0
    if scale is not None:
        scale = scale.to(torch.float32).contiguous()
        if scale.shape[-1] != width or scale.numel() * q != x.numel():
            raise ValueError(f"scale {tuple(scale.shape)} does not fit rows {tuple(x.shape)}")
        s_ptr, s_stride = scale.data_ptr(), width
    lo_ptr = hi_ptr = None
    if lo is not None or hi is not None:
        lo = (torch.zeros(q, dtype=torch.int64) if lo is None else lo).to(torch.int64).contiguous()
        hi = (torch.full((q,), width, dtype=torch.int64) if hi is None else hi).to(torch.int64).contiguous()
        if lo.shape != (q,) or hi.shape != (q,):
            raise ValueError(f"lo and hi must be [{q}] (one range per query)")
        lo_ptr, hi_ptr = lo.data_ptr(), hi.data_ptr()
    failed = lib.cwlens_row_topk(x.data_ptr(), n_rows, width, width, s_ptr, q, s_stride, lo_ptr,
                                 hi_ptr, q, int(k), int(bool(by_abs)), idx.data_ptr(), val.data_ptr(),
                                 torch.get_num_threads())
    if failed:
        raise MemoryError(f"row_topk: out of memory for rows of {width} keys")
    return idx, val
