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
never loads another CPU's build. Where ``CWLENS_NATIVE=0`` is set (read at every call of
:func:`available`, the one switch every caller asks), no compiler is found or the build
fails (said once on stderr), cwlens computes the same values with torch (tests run both:
``tests/test_native_topk.py``, ``tests/test_native_masks.py``). Every tensor handed to C
is checked here (:func:`_c_array`): C trusts the sizes.
"""

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch

from cwlens.core.env import flag

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
    return bool(flag("CWLENS_NATIVE", True))  # one rule for every variable (cwlens.core.env)


def _compiled(cc: str, source: bytes, flags: tuple[str, ...]) -> ctypes.CDLL | str:
    """The build with ``flags`` (compiled here once), or why it failed: the compiler's first
    error line."""
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
    except subprocess.CalledProcessError as e:
        lines = [line.strip() for line in (e.stderr or b"").decode(errors="replace").splitlines() if line.strip()]
        return next((line for line in lines if "error" in line.lower()), lines[0] if lines else
                    f"{Path(cc).name} exited with status {e.returncode}")
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)


def _without(reason: str) -> None:
    """Say once per process, on one line of stderr, that the kernels are not built and why."""
    if not _state.get("told"):
        _state["told"] = True
        print(f"cwlens: no C kernels ({reason[:300]}); computing with torch, slower (the streamed pass "
              "about 1.6x). Set CWLENS_NATIVE=0 to choose torch and silence this.", file=sys.stderr)


def _build() -> ctypes.CDLL | None:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        _without(f"no C compiler found: neither CC={os.environ.get('CC', 'cc')!r} nor gcc")
        return None
    source = b"\0".join(path.read_bytes() for path in (*SOURCES, *HEADERS))
    for extra in (OPENMP, ()):  # OpenMP where the compiler has it (parallel.c), else threads of our own
        lib = _compiled(cc, source, (*FLAGS, *extra))
        if not isinstance(lib, str):
            break
    else:  # the error of the build without OpenMP
        _without(f"{cc} failed: {lib}")
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
    """The compiled kernels, or None (``CWLENS_NATIVE=0``, no compiler, a failed build)."""
    if not _wanted():
        return None
    if "lib" not in _state:
        _state["lib"] = _build()
    return _state["lib"]  # type: ignore[return-value]


def available() -> bool:
    """The one switch: True where the C kernels compute (``CWLENS_NATIVE`` is not off, read
    at every call, and they are built), False where torch does."""
    return library() is not None


def _kernels() -> ctypes.CDLL:
    lib = library()
    if lib is None:
        raise RuntimeError("cwlens.engine.native: no compiled kernels (see available())")
    return lib


def _c_array(name: str, t: torch.Tensor, dtype: torch.dtype, *shape: int | None,
             rows: bool = False) -> torch.Tensor:
    """``t`` as C reads it: a CPU tensor of ``dtype`` and ``shape`` (None: any length on that
    axis), contiguous (``rows``: its last axis only, the other strides handed to C); an
    integer tensor is converted to an integer ``dtype``, floats must be ``dtype``. Every
    tensor handed to C passes here (ValueError naming it otherwise): C trusts the sizes."""
    fits = t.dim() == len(shape) and all(n is None or n == m for n, m in zip(shape, t.shape, strict=True))
    ints = not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool
                or dtype.is_floating_point)
    if t.device.type != "cpu" or not fits or not (t.dtype == dtype or ints):
        want = ", ".join("*" if n is None else str(n) for n in shape)
        raise ValueError(f"{name} must be a {str(dtype).removeprefix('torch.')} CPU tensor [{want}]; "
                         f"got {t.dtype} {tuple(t.shape)} on {t.device}")
    t = t.to(dtype)
    return t if rows and t.stride(-1) == 1 else t.contiguous()


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
    lib = _kernels()
    *lead, q, width = x.shape  # (ValueError where x is not [..., q, width])
    x = _c_array("row_topk's x", x, torch.float32, *x.shape)
    k = max(int(k), 0)
    n_rows = x.numel() // width if width else 0
    idx = torch.full((*lead, q, k), -1, dtype=torch.int32)
    val = torch.full((*lead, q, k), float("nan"), dtype=torch.float32)  # key -1's, kept: C writes no NaN
    if n_rows == 0 or k == 0:
        return idx, val
    s_ptr, s_stride = None, 0
    if scale is not None:  # one row per q rows of x
        scale = _c_array("row_topk's scale", scale, torch.float32, *lead, width)
        s_ptr, s_stride = scale.data_ptr(), width
    lo_ptr = hi_ptr = None
    if lo is not None or hi is not None:  # one range per query
        lo = _c_array("row_topk's lo", torch.zeros(q, dtype=torch.int64) if lo is None else lo, torch.int64, q)
        hi = _c_array("row_topk's hi", torch.full((q,), width) if hi is None else hi, torch.int64, q)
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
    lib = _kernels()
    scores = _c_array("row_masks' scores", scores, torch.float32, None, None, None, None)
    b, h, q, width = scores.shape
    ties = _c_array("row_masks' ties", ties.to(torch.float32).expand(b, h, q, width), torch.float32, b, h, q, width)
    e = lo.shape[1] if lo.dim() == 3 and lo.shape[1] == h else 1
    lo = _c_array("row_masks' lo", lo, torch.int64, b, e, q)
    hi = _c_array("row_masks' hi", hi, torch.int64, b, e, q)
    first = _c_array("row_masks' first", first, torch.int64, b)
    n_jobs = len(modes)
    ks = _c_array("row_masks' ks", ks, torch.int64, n_jobs, b, e, q)
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
    lib = _kernels()
    x = _c_array("zero_masked's x", x, torch.float32, *x.shape)
    width = x.shape[-1] if x.dim() else 0
    bits = _c_array("zero_masked's bits", bits, torch.uint8, *x.shape[:-1], None)
    if bits.shape[-1] * 8 < width:
        raise ValueError(f"zero_masked's bits {tuple(bits.shape)} hold fewer than the {width} keys of x")
    out = torch.empty_like(x)
    lib.cwlens_zero_masked(x.data_ptr(), bits.data_ptr(), out.data_ptr(), x.numel() // max(width, 1),
                           width, bits.shape[-1], torch.get_num_threads())
    return out


def uniforms(rows: torch.Tensor, keys: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[len(rows), len(keys)]`` seeded uniforms in [0, 1) (float64, or rounded once to
    float32) from each row's hash ``rows`` and the key positions ``keys`` (int64): the
    values of :func:`cwlens.faithfulness.ranking.uniforms_at`'s per-entry hash, in one
    pass (``uniforms.c``)."""
    lib = _kernels()
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"uniforms are float32 or float64; got {dtype}")
    rows = _c_array("uniforms' rows", rows.reshape(-1), torch.int64, None)
    keys = _c_array("uniforms' keys", keys.reshape(-1), torch.int64, None)
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
    lib = _kernels()
    alpha, u, vt, vnorm, inv1, lo, hi = block
    alpha = _c_array("block_measures' alpha", alpha, torch.float32, None, None, None, rows=True)
    h, q, width = alpha.shape
    d = u.shape[-1]
    if vt is None:  # not read: no contribution
        if contribution:
            raise ValueError("block_measures: the contribution needs the values (vt)")
        vt = torch.zeros(1, 1, d, 16)
    kv = vt.shape[0]
    if (k < 1 or h % max(kv, 1) or vt.dim() != 4 or vt.shape[2] != d or (contribution and vt.shape[1] * 16 < width)
            or vnorm.dim() != 2 or vnorm.shape[-1] < width or inv1.dim() != 2 or inv1.shape[0] not in (1, h)):
        raise ValueError(f"block_measures: shapes do not fit: k {k}, alpha {tuple(alpha.shape)}, u "
                         f"{tuple(u.shape)}, vt {tuple(vt.shape)}, vnorm {tuple(vnorm.shape)}, "
                         f"inv1 {tuple(inv1.shape)}")
    u = _c_array("block_measures' u", u, torch.float32, h, q, d)
    vt = _c_array("block_measures' vt", vt, torch.float32, kv, None, d, 16)
    vnorm = _c_array("block_measures' vnorm", vnorm, torch.float32, h, None)
    inv1 = _c_array("block_measures' inv1", inv1, torch.float32, None, q)
    lo = _c_array("block_measures' lo", lo, torch.int64, q)
    hi = _c_array("block_measures' hi", hi, torch.int64, q)
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
    val.masked_fill_(idx < 0, float("nan"))  # key -1's (C writes no NaN: -ffinite-math-only)
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
