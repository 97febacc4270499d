"""The ``cwlens`` command line (a leaf: nothing in the library imports it)."""
