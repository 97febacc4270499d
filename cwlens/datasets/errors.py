"""Exceptions raised by the dataset layer.

All derive from the package-wide ``cwlens.errors.CwlensError`` and from the matching
built-in (so ``except ValueError`` keeps working). ``DatasetFormatError`` is the
package's own class, re-exported here.
"""

from __future__ import annotations

from ..errors import CwlensError, DatasetFormatError, UnknownOptionError

__all__ = ["CwlensError", "DatasetFormatError", "DatasetSourceError", "UnknownDatasetError"]

# DatasetFormatError(CwlensError, ValueError): a malformed row; the message names the
# file (or hub source), the 1-based line, what was wrong and the expected schema.


class UnknownDatasetError(UnknownOptionError):
    """A dataset name that cwlens does not know; the message lists valid names."""


class DatasetSourceError(CwlensError, RuntimeError):
    """The requested source cannot be used (``datasets`` missing, hub unreachable...)."""
