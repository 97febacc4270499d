"""argparse ``type=`` functions and path checks: every flag is validated before a model loads.

A ``type=`` function raises :class:`argparse.ArgumentTypeError`, which argparse turns into
``cwlens <command>: error: argument --flag: <message>`` and exit code 2. The path checks
(:func:`output_dir`, :func:`output_file`) look at the file system without changing it:
the nearest existing ancestor must be a folder we may write into.
"""

import argparse
import math
from pathlib import Path

from cwlens.runs.paths import html_file as html_file
from cwlens.runs.paths import markdown_file as markdown_file

# the path checks (OutputPathError, exit 1) live a layer down: the exports use them too
from cwlens.runs.paths import output_dir as output_dir
from cwlens.runs.paths import output_file as output_file

Error = argparse.ArgumentTypeError


def _items(text: str, what: str) -> list[str]:
    """Comma-separated items; empty items (``"0.1,,0.3"``, ``""``) are refused."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise Error(f"expected a comma-separated list of {what}, e.g. {_EXAMPLES[what]}; got {text!r}")
    return items


_EXAMPLES = {
    "rates": "0.1,0.3,0.5",
    "scales": "0,0.5",
    "layer indices": "0,5,10",
    "names": "gsm8k,fineweb_edu",
    "counts": "50 or gsm8k=50,mmlu=100",
    "markdown files": "docs/a.md,docs/b.md",
}


def _no_duplicates(values: list, what: str, text: str) -> None:
    seen, dup = set(), []
    for v in values:
        if v in seen and v not in dup:
            dup.append(v)
        seen.add(v)
    if dup:
        shown = ", ".join(map(str, dup))
        raise Error(f"{what} listed twice ({shown}) in {text!r}: each would be counted twice; "
                    "give each once")


def markdown_list(text: str) -> str:
    """``--summary-md``: comma-separated markdown paths, each once (``a.md,a.md`` wrote
    the same block twice; ``a.md,`` is an empty path), returned as one comma-joined
    string without the spaces around the items."""
    items = _items(text, "markdown files")

    _no_duplicates([str(Path(t).expanduser().resolve()) for t in items], "markdown file", text)
    return ",".join(items)


def _int_at_least(text: str, minimum: int, expected: str, too_small: str) -> int:
    """``int(text)`` if it is ``>= minimum``; else the error ``expected ...`` (not an
    integer) or ``too_small`` (out of range), each naming the value."""
    try:
        value = int(text)
    except ValueError:
        raise Error(f"expected {expected}; got {text!r}") from None
    if value < minimum:
        raise Error(f"{too_small}; got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _int_at_least(text, 1, "a positive integer (1, 2, ...)",
                         "must be a positive integer (1, 2, ...)")


def non_negative_int(text: str) -> int:
    """An integer >= 0 (an index, a seed)."""
    return _int_at_least(text, 0, "a non-negative integer (0, 1, ...)", "must be 0 or more")


def max_tokens(text: str) -> int:
    """A truncation length: a positive integer (0 and negatives would mean "all" / "drop the end")."""
    return _int_at_least(text, 1, "a positive number of tokens, e.g. 128",
                         "must be a positive number of tokens, e.g. 128 (leave the flag out for "
                         "whole texts where the command allows it)")


def _finite_float(item: str, text: str, what: str) -> float:
    try:
        value = float(item)
    except ValueError:
        raise Error(f"{item!r} in {text!r} is not a number; expected {what}, "
                    f"e.g. {_EXAMPLES[what]}") from None
    if not math.isfinite(value):
        raise Error(f"{item!r} in {text!r} is not a finite number")
    if value == 0.0 and any(c in "123456789" for c in item.lower().split("e")[0]):
        raise Error(f"{item!r} in {text!r} is too small for a float and would be read as 0; "
                    f"write 0 if you mean 0")
    return value


def rates(text: str) -> tuple[float, ...]:
    """Comma-separated removal rates in [0, 1], each given once."""
    values = [_finite_float(item, text, "rates") for item in _items(text, "rates")]
    bad = [v for v in values if not 0.0 <= v <= 1.0]
    if bad:
        raise Error(f"rates are fractions in [0, 1]; got {', '.join(map(str, bad))} in {text!r}")
    _no_duplicates(values, "rate", text)
    return tuple(values)


def positive_float(text: str) -> float:
    """A finite number above 0 (a size in MB, ...)."""
    try:
        value = float(text)
    except ValueError:
        raise Error(f"expected a positive number; got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise Error(f"must be a positive number; got {text}")
    return value


def fraction(text: str) -> float:
    """A number in [0, 1] (a threshold)."""
    try:
        value = float(text)
    except ValueError:
        raise Error(f"expected a number in [0, 1]; got {text!r}") from None
    if value == 0.0 and any(c in "123456789" for c in text.lower().split("e")[0]):
        raise Error(f"{text!r} is too small for a float and would be read as 0; write 0 if you mean 0")
    if not 0.0 <= value <= 1.0:
        raise Error(f"must be in [0, 1]; got {text}")
    return value


def scales(text: str) -> tuple[float, ...]:
    """Comma-separated finite scale factors, each given once."""
    values = [_finite_float(item, text, "scales") for item in _items(text, "scales")]
    _no_duplicates(values, "scale", text)
    return tuple(values)


def layer_list(text: str) -> tuple[int, ...]:
    """Comma-separated layer indices >= 0, each given once (checked against the model later)."""
    values = []
    for item in _items(text, "layer indices"):
        try:
            values.append(int(item))
        except ValueError:
            raise Error(f"{item!r} in {text!r} is not a layer index; expected integers, "
                        "e.g. 0,5,10") from None
    negative = [v for v in values if v < 0]
    if negative:
        raise Error(f"layer indices start at 0; got {', '.join(map(str, negative))}")
    _no_duplicates(values, "layer", text)
    return tuple(values)


def layers_or_all(text: str) -> tuple[int, ...] | None:
    """``all`` (None) or a :func:`layer_list`."""
    return None if text.strip() == "all" else layer_list(text)


def choice_list(valid: tuple[str, ...], what: str, allow_all: bool | tuple[str, ...] = False):
    """A type for comma-separated names from ``valid`` (each once); ``all`` if allowed
    (``allow_all`` may name what ``all`` means, e.g. the default metrics of a larger set)."""

    def parse(text: str) -> tuple[str, ...]:
        if allow_all and text.strip() == "all":
            return tuple(allow_all) if isinstance(allow_all, tuple) else tuple(valid)
        if not text.strip():
            raise Error(f"expected a comma-separated list of {what}s, e.g. "
                        f"{','.join(valid[:2])}; got {text!r}")
        names = _items(text, "names")
        unknown = [n for n in names if n not in valid]
        if allow_all and "all" in unknown:
            raise Error(f"'all' stands alone (every {what}); got {text!r}: give 'all' or a "
                        f"list of names, e.g. {','.join(valid[:2])}")
        if unknown:
            raise Error(f"unknown {what} {', '.join(map(repr, unknown))}; valid: "
                        + ", ".join(valid) + (", or all (alone)" if allow_all else ""))
        _no_duplicates(names, what, text)
        return tuple(names)

    parse.__name__ = f"{what}_list"
    return parse


def dataset_list(kinds: tuple[str, ...] = ("text", "choice")):
    """Comma-separated dataset names (of the given kinds), each once."""
    from cwlens.datasets import available_datasets

    names = tuple(d.name for d in available_datasets() if d.kind in kinds)
    return choice_list(names, "dataset")


def device(text: str) -> str:
    """cpu, cuda, cuda:N or mps, available on this machine (checked before any load)."""
    from cwlens.engine.models.loading import check_device
    from cwlens.errors import DeviceNotAvailableError

    try:
        check_device(text)
    except DeviceNotAvailableError as err:
        raise Error(str(err)) from None
    return text


def text_file(text: str) -> str:
    """A readable UTF-8 text file, or ``-`` for standard input."""
    if text == "-":
        return text
    path = Path(text).expanduser()
    if not path.exists():
        raise Error(f"{text!r} does not exist")
    if path.is_dir():
        raise Error(f"{text!r} is a directory; pass a text file")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise Error(f"cannot read {text!r}: {err.strerror}") from None
    if b"\0" in data:
        raise Error(f"{text!r} is a binary file; pass a UTF-8 text file")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise Error(f"{text!r} is not UTF-8 text (byte {err.start}: {data[err.start:err.start + 1]!r}); "
                    "convert it, e.g. iconv -t UTF-8") from None
    return str(path)


def read_text(path: str, flag: str = "--file") -> str:
    """The text of a :func:`text_file` argument; ``-`` reads standard input as UTF-8
    (bytes decoded strictly: a terminal's lenient decoding would pass lone surrogates on)."""
    from cwlens.errors import InvalidArgumentError

    if path != "-":
        return Path(path).read_text(encoding="utf-8")  # checked by text_file
    import sys

    stream = getattr(sys.stdin, "buffer", None)
    data = stream.read() if stream is not None else sys.stdin.read()
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if b"\0" in data:
        raise InvalidArgumentError(f"{flag} -: standard input is binary; pipe in UTF-8 text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidArgumentError(
            f"{flag} -: standard input is not UTF-8 text (byte {err.start}: "
            f"{data[err.start:err.start + 1]!r}); convert it, e.g. iconv -t UTF-8") from None


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (a threshold on |weight|)."""
    try:
        value = float(text)
    except ValueError:
        raise Error(f"expected a number >= 0, e.g. 0.02; got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise Error(f"must be a finite number >= 0, e.g. 0.02; got {text}")
    return value


def samples_spec(text: str) -> int | dict[str, int]:
    """``N`` (every dataset) or ``name=N,...`` with positive counts, each name once."""
    if "=" not in text:
        return positive_int(text)
    counts: dict[str, int] = {}
    for item in _items(text, "counts"):
        name, sep, count = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise Error(f"expected name=N in {text!r}, e.g. gsm8k=50,mmlu=100; got {item!r}")
        if name in counts:
            raise Error(f"{name!r} is given twice in {text!r}")
        try:
            counts[name] = positive_int(count.strip())
        except Error as err:
            raise Error(f"{name}: {err}") from None
    return counts

