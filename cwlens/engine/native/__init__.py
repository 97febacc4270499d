"""Small C kernels for the CPU, compiled on first use with the system's C compiler.

:func:`row_topk` ranks each row of a block of attention measures in one pass
(``row_topk.c``): the streamed pass's top-k lists on the CPU, where ``torch.topk`` costs
~10 ns a key. The faithfulness sweep's: :func:`row_masks` (``row_masks.c``) makes every
row-scope mask of a metric (each cut selected, no sort, written bit-packed, with its
counts), :func:`zero_masked` (``zero_masked.c``) applies a packed mask to attention
weights in one pass, :func:`uniforms` (``uniforms.c``) draws the seeded tie-break and
random-control uniforms. The sources are
compiled once per machine (``cc -O3 -march=native``, a second or two) into
``$CWLENS_CACHE`` (default ``~/.cache/cwlens``)/native, named by a hash of the sources,
the flags and the CPU's features, so that a home folder shared by different machines
never loads another CPU's build. Where no compiler is found, the build fails, or
``CWLENS_NATIVE=0`` is set, :func:`available` is False and cwlens computes the same
values with torch (tests run both: ``tests/test_native_topk.py``,
``tests/test_native_masks.py``).
"""

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch

SOURCES = tuple(Path(__file__).with_name(name) for name in
                ("parallel.c", "row_topk.c", "row_masks.c", "zero_masked.c", "uniforms.c",
                 "block_measures.c"))
# in the build's name, not on its command line
HEADERS = tuple(Path(__file__).with_name(name) for name in ("parallel.h", "topk_list.h"))
# -ffinite-math-only -fno-signed-zeros: the chunk maxima vectorise (5x faster); the values
# ranked are finite (cwlens checks every measure it ranks, and a <= 1 times a finite norm)
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-ffinite-math-only",
         "-fno-signed-zeros", "-shared", "-fPIC", "-pthread")
# the kernels' threads: OpenMP's, which are torch's own where torch's libgomp.so.1 is loaded
# (parallel.c); tried first, then the build goes without
OPENMP = ("-fopenmp",)
_state: dict[str, object] = {}


def _cpu_features() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def _cache_dir() -> Path:
    return Path(os.environ.get("CWLENS_CACHE") or Path.home() / ".cache" / "cwlens") / "native"




def _wanted() -> bool:
    """``CWLENS_NATIVE``: unset or 1/true/yes/on builds the kernels, 0/false/no/off leaves
    them out (any case); anything else is refused, naming the values it takes."""
    from cwlens.core.env import flag

    return bool(flag("CWLENS_NATIVE", True))  # one rule for every variable (cwlens.core.env)


def _compiled(cc: str, source: bytes, flags: tuple[str, ...]) -> ctypes.CDLL | None:
    tag = hashlib.sha256(b"\0".join([source, " ".join(flags).encode(), platform.machine().encode(),
                                     _cpu_features().encode()])).hexdigest()[:16]
    target = _cache_dir() / f"kernels-{tag}.so"
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                built = Path(tmp) / target.name
                subprocess.run([cc, *flags, *map(str, SOURCES), "-o", str(built), "-lm"], check=True,
                               capture_output=True, timeout=120)
                os.replace(built, target)  # atomic: processes building at once never see half a file
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError):
        return None


def _build() -> ctypes.CDLL | None:
    if not _wanted():
        return None
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        return None
    source = b"\0".join(path.read_bytes() for path in (*SOURCES, *HEADERS))
    lib = None
    for extra in (OPENMP, ()):  # OpenMP where the compiler has it (parallel.c), else threads of our own
        lib = _compiled(cc, source, (*FLAGS, *extra))
        if lib is not None:
            break
    if lib is None:
        return None
    fn = lib.cwlens_row_topk
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    fn.argtypes = [p, i64, i64, i64, p, i64, i64, p, p, i64, i32, i32, p, p, i32]
    fn.restype = i32
    fn = lib.cwlens_row_masks
    fn.argtypes = [p, p, i64, i64, i64, i64, p, p, i64, i64, p, i32, p, p, p, p, i32]
    fn.restype = i32
    fn = lib.cwlens_zero_masked
    fn.argtypes = [p, p, p, i64, i64, i64, i32]
    fn.restype = i32
    fn = lib.cwlens_uniforms
    fn.argtypes = [p, p, i64, i64, p, i32, i32]
    fn.restype = i32
    fn = lib.cwlens_block_measures
    fn.argtypes = [p, i64, i64, p, p, i64, p, i64, p, i64, p, p, i64, i64, i64, i64, i64, i32, i32,
                   p, p, p, i32]
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


def row_masks(scores: torch.Tensor, ties: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
              first: torch.Tensor, modes: list[int], ks: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Row-scope masks of several jobs over ``scores`` ``[b, h, q, width]`` (float32, CPU),
    ordered by score, then ``ties`` (same shape), then key position (the order of
    :func:`cwlens.faithfulness.ranking.rank_entries`), in one call (``row_masks.c``).

    ``lo``/``hi`` int64 ``[b, e, q]`` (``e`` 1 or ``h``): row ``(b, h, q)`` ranks keys
    ``lo <= j < hi``. ``first`` int64 ``[b]``: each text's first real key (-1: none).
    ``modes[j]``: 0 comprehensiveness (the ``k`` best removed), 1 sufficiency (the ``k``
    worst); ``ks`` int64 ``[jobs, b, e, q]``: ``k`` of each job and row. Returns ``(bits
    uint8 [jobs, b, h, q, ceil(width / 8)]`` (:class:`cwlens.core.bitmask.PackedMask`'s
    layout), ``counts int32 [jobs, b, h, q, 3]``: removed, removed by the tie-break, removed
    on the first token), or None where an eligible score is NaN (rank those with torch)."""
    lib = library()
    if lib is None:
        raise RuntimeError("cwlens.engine.native: no compiled kernels (see available())")
    if scores.dtype != torch.float32 or scores.device.type != "cpu" or scores.dim() != 4:
        raise ValueError(f"row_masks takes float32 CPU [b, h, q, width] scores; got {scores.dtype} "
                         f"{tuple(scores.shape)} on {scores.device}")
    b, h, q, width = scores.shape
    ties = ties.to(torch.float32).expand(b, h, q, width).contiguous()
    scores = scores.contiguous()
    e = lo.shape[1]
    if lo.shape != (b, e, q) or hi.shape != lo.shape or e not in (1, h):
        raise ValueError(f"lo/hi must be [{b}, 1 or {h}, {q}]; got {tuple(lo.shape)}, {tuple(hi.shape)}")
    n_jobs = len(modes)
    if ks.shape != (n_jobs, b, e, q):
        raise ValueError(f"ks must be [{n_jobs}, {b}, {e}, {q}]; got {tuple(ks.shape)}")
    lo, hi = lo.to(torch.int64).contiguous(), hi.to(torch.int64).contiguous()
    first = first.to(torch.int64).contiguous()
    ks = ks.to(torch.int64).contiguous()
    mode_t = torch.tensor(modes, dtype=torch.int32)
    bits = torch.zeros(n_jobs, b, h, q, (width + 7) // 8, dtype=torch.uint8)
    counts = torch.zeros(n_jobs, b, h, q, 3, dtype=torch.int32)
    if n_jobs and scores.numel():
        failed = lib.cwlens_row_masks(scores.data_ptr(), ties.data_ptr(), b * h * q, width, h, q,
                                      lo.data_ptr(), hi.data_ptr(), int(e == h and h > 1), b * e * q,
                                      first.data_ptr(), n_jobs, mode_t.data_ptr(), ks.data_ptr(),
                                      bits.data_ptr(), counts.data_ptr(), torch.get_num_threads())
        if failed == -2:
            return None  # an eligible score is NaN: torch ranks these
        if failed:
            raise MemoryError(f"row_masks: out of memory for rows of {width} keys")
    return bits, counts


def zero_masked(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """``x`` (float32 CPU ``[..., width]``) with the entries whose bit is set in ``bits``
    (uint8 ``[..., >= ceil(width / 8)]``, :class:`cwlens.core.bitmask.PackedMask`'s
    layout, the same leading shape) set to 0: a packed mask applied in one pass, without
    unpacking it (``zero_masked.c``)."""
    lib = library()
    if lib is None:
        raise RuntimeError("cwlens.engine.native: no compiled kernels (see available())")
    width = x.shape[-1]
    if (x.dtype != torch.float32 or x.device.type != "cpu" or bits.dtype != torch.uint8
            or bits.shape[:-1] != x.shape[:-1] or bits.shape[-1] * 8 < width):
        raise ValueError(f"zero_masked takes float32 CPU x and uint8 bits of its rows; got "
                         f"{x.dtype} {tuple(x.shape)} and {bits.dtype} {tuple(bits.shape)}")
    x, bits = x.contiguous(), bits.contiguous()
    out = torch.empty_like(x)
    lib.cwlens_zero_masked(x.data_ptr(), bits.data_ptr(), out.data_ptr(), x.numel() // max(width, 1),
                           width, bits.shape[-1], torch.get_num_threads())
    return out


def uniforms(rows: torch.Tensor, keys: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[len(rows), len(keys)]`` seeded uniforms in [0, 1) (float64, or rounded once to
    float32) from each row's hash ``rows`` and the key positions ``keys`` (int64): the
    values of :func:`cwlens.faithfulness.ranking.uniforms_at`'s per-entry hash, in one
    pass (``uniforms.c``)."""
    lib = library()
    if lib is None:
        raise RuntimeError("cwlens.engine.native: no compiled kernels (see available())")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"uniforms are float32 or float64; got {dtype}")
    rows = rows.to(torch.int64).reshape(-1).contiguous()
    keys = keys.to(torch.int64).reshape(-1).contiguous()
    out = torch.empty(len(rows), len(keys), dtype=dtype)
    lib.cwlens_uniforms(rows.data_ptr(), keys.data_ptr(), len(rows), len(keys), out.data_ptr(),
                        int(dtype == torch.float64), torch.get_num_threads())
    return out


# what block_measures computes (its `wants`): the three top-k lists, the column sums
TOPK_METRICS = ("contribution", "attention", "value_weighted")


class BlockInputs(NamedTuple):
    """One text's block for :func:`block_measures` (shapes there)."""

    alpha: torch.Tensor
    u: torch.Tensor
    vt: torch.Tensor | None
    vnorm: torch.Tensor
    inv1: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor


def block_measures(block: BlockInputs, k: int, topk: tuple[str, ...], column_sums: bool, contribution: bool
                   ) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], torch.Tensor | None] | None:
    """One text's block of the streamed pass in one call (``block_measures.c``).

    ``block`` (:class:`BlockInputs`): ``alpha`` ``[head, q, width]`` (float32 CPU, last axis contiguous), ``u`` ``[head, q, d]``
    (``o W_O^h^T / ||o||^2``), ``vt`` ``[kv_head, key // 16, d, 16]`` (the values in
    panels of 16 keys, :func:`value_panels`), ``vnorm`` ``[head, >= width]``
    (``||v~_j^h||``), ``inv1`` ``[head or 1, q]`` (``1 / ||o_i||``), ``lo``/``hi`` ``[q]``
    int64: row ``i`` holds keys ``lo[i] <= j < hi[i]``.

    Returns ``({metric: (indices int32, values) [head, q, k]} for each metric of topk (of
    TOPK_METRICS), column sums [3, head, width] (of the contribution, of a, of
    a / ||o||) or None)``, or None where a contribution is not finite (torch then computes
    the block and names it). ``contribution`` False: the contribution is neither ranked
    nor summed (its column-sum row is then 0)."""
    lib = library()
    if lib is None:
        raise RuntimeError("cwlens.engine.native: no compiled kernels (see available())")
    alpha, u, vt, vnorm, inv1, lo, hi = block
    h, q, width = alpha.shape
    if vt is None:  # not read: no contribution
        if contribution:
            raise ValueError("block_measures: the contribution needs the values (vt)")
        vt = torch.zeros(1, -(-width // 16), u.shape[-1], 16).expand(h, -1, -1, -1)
    kv, d = vt.shape[0], vt.shape[2]
    tensors = (alpha, u, vt, vnorm, inv1)
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors):
        raise ValueError("block_measures takes float32 CPU tensors")
    if (alpha.stride(-1) != 1 or u.shape != (h, q, d) or h % kv or vt.shape[1] * 16 < width or vt.shape[3] != 16
            or vnorm.shape[0] != h or vnorm.shape[1] < width or inv1.shape[-1] != q
            or inv1.shape[0] not in (1, h) or lo.shape != (q,) or hi.shape != (q,)):
        raise ValueError(f"block_measures: shapes do not fit: alpha {tuple(alpha.shape)}, u "
                         f"{tuple(u.shape)}, vt {tuple(vt.shape)}, vnorm {tuple(vnorm.shape)}, "
                         f"inv1 {tuple(inv1.shape)}")
    u, vnorm, inv1 = u.contiguous(), vnorm.contiguous(), inv1.contiguous()
    if contribution:
        vt = vt.contiguous()
    lo, hi = lo.to(torch.int64).contiguous(), hi.to(torch.int64).contiguous()
    wants = int(contribution) | (16 if contribution and "contribution" in topk else 0)
    wants |= (2 if "attention" in topk else 0) | (4 if "value_weighted" in topk else 0)
    wants |= 8 if column_sums else 0
    idx = torch.empty(3, h, q, k, dtype=torch.int32)
    val = torch.empty(3, h, q, k, dtype=torch.float32)
    cols = torch.zeros(3, h, width, dtype=torch.float32) if column_sums else None
    code = lib.cwlens_block_measures(
        alpha.data_ptr(), alpha.stride(0), alpha.stride(1), u.data_ptr(), vt.data_ptr(), vt.stride(0),
        vnorm.data_ptr(), vnorm.stride(0), inv1.data_ptr(), q if inv1.shape[0] > 1 else 0,
        lo.data_ptr(), hi.data_ptr(), h, h // kv, q, width, d, int(k), wants, idx.data_ptr(),
        val.data_ptr(), None if cols is None else cols.data_ptr(), torch.get_num_threads())
    if code == -2:
        return None
    if code:
        raise MemoryError(f"block_measures: out of memory for rows of {width} keys")
    tops = {m: (idx[i], val[i]) for i, m in enumerate(TOPK_METRICS) if m in topk}
    return tops, cols


def value_panels(v: torch.Tensor) -> torch.Tensor:
    """``[key, kv_head, d]`` values as :func:`block_measures` reads them: ``[kv_head,
    ceil(key / 16), d, 16]`` float32, contiguous, zero past the last key (each panel of 16
    keys one run of memory)."""
    n, kv, d = v.shape
    nb = -(-n // 16)
    out = torch.zeros(kv, nb * 16, d, dtype=torch.float32)
    out[:, :n] = v.permute(1, 0, 2)
    return out.view(kv, nb, 16, d).transpose(2, 3).contiguous()
