"""Output folder and file checks (:class:`~cwlens.errors.OutputPathError`), made before a
model loads: they look at the file system without changing it, and the nearest existing
ancestor must be a folder we may write into. The CLI's flags (:mod:`cwlens.cli.arg_types`)
and the exports (:mod:`cwlens.report.export`) use them.
"""

import os
import tempfile
from pathlib import Path

from cwlens.errors import OutputPathError


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    return p


def _writable(folder: Path) -> bool:
    """Whether a file can be created in ``folder`` (permissions *and* read-only mounts,
    which ``os.access`` misses for root): an anonymous temp file, deleted at once."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def _check_ancestors(path: Path, flag: str) -> None:
    """No ancestor of ``path`` is a file, and the nearest existing one is writable."""
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise OutputPathError(f"{flag} {str(path)!r}: {str(base)!r} is a file, not a folder; "
                              "pass a path inside a folder")
    if not _writable(base):
        raise OutputPathError(f"{flag} {str(path)!r}: no permission to write into {str(base)!r}; "
                              "pass a writable location")


# names that are files, not folders: a folder flag given one of these is a slip
FILE_SUFFIXES = (".png", ".html", ".htm", ".pdf", ".svg", ".jsonl", ".json", ".gz", ".csv",
                 ".parquet", ".md", ".txt", ".ipynb")


def _not_blank(path: str | Path, flag: str) -> None:
    text = str(path)
    if not text:  # Path("") is ".": the files would land in the working directory
        raise OutputPathError(f"{flag} is empty: pass a path ('.' for the current folder)")
    if not text.strip():  # Path(" ") is a folder named " "
        raise OutputPathError(f"{flag} {text!r} is blank: pass a path (or '' where the flag "
                              "allows none)")


def output_dir(path: str | Path, flag: str = "--out", must_write: bool = True) -> Path:
    """A folder to write into: not a file, under folders, writable (if ``must_write``)."""
    _not_blank(path, flag)
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise OutputPathError(f"{flag} {str(p)!r} is a file; pass a folder (it is created if "
                              "missing)")
    if not p.exists() and p.name.lower().endswith(FILE_SUFFIXES):
        raise OutputPathError(
            f"{flag} {str(p)!r} names a file ({p.suffix}), but it is a folder that the "
            f"command writes into; pass a folder, e.g. {str(p.with_suffix(''))!r}")
    base = _nearest_existing(p)
    if not base.is_dir():
        raise OutputPathError(f"{flag} {str(p)!r}: {str(base)!r} is a file, not a folder")
    if must_write and not _writable(base):
        raise OutputPathError(f"{flag} {str(p)!r}: no permission to write into {str(base)!r}; "
                              "pass a writable folder")
    return p


def output_file(path: str | Path, flag: str = "--out", example: str = "report.html") -> Path:
    """A file to (over)write: not a folder, its folder creatable and writable."""
    _not_blank(path, flag)
    p = Path(path).expanduser()
    if p.is_dir() or str(path).endswith(("/", os.sep)):
        what = "is a folder" if p.is_dir() else "ends with '/', which names a folder"
        raise OutputPathError(f"{flag} {str(path)!r} {what}; pass a file name, e.g. "
                              f"{str(p / example)!r}")
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputPathError(f"{flag} {str(p)!r} exists and is read-only; pass another file")
    _check_ancestors(p, flag)
    return p


MARKDOWN_SUFFIXES = (".md", ".markdown")


def markdown_file(path: str | Path, flag: str = "--summary-md") -> Path:
    """A Markdown page to write a generated block into: :func:`output_file`, named
    ``*.md`` or ``*.markdown`` (a notebook, a script or a results file would be rewritten
    as text)."""
    p = output_file(path, flag, "summary.md")
    if not p.name.lower().endswith(MARKDOWN_SUFFIXES):
        raise OutputPathError(
            f"{flag} {str(p)!r} is not a Markdown page (.md or .markdown); the tables are "
            f"written into one, e.g. {str(p.with_name('summary.md'))!r}")
    return p


def html_file(path: str | Path, flag: str = "--out") -> Path:
    """An HTML report to (over)write: :func:`output_file`, named ``*.html`` or ``*.htm``."""
    p = output_file(path, flag)
    if not p.name.lower().endswith((".html", ".htm")):
        raise OutputPathError(
            f"{flag} {str(p)!r} is not an .html file; the report is a self-contained HTML "
            f"page, e.g. {str(p.with_suffix('.html'))!r}")
    return p
