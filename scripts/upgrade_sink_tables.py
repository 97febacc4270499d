"""Rewrite the tables of finished ``cwlens sinks`` runs with the current column names.

Before #39.6 the per-head tables called the intra-head sink contribution
``sink_contribution`` (the same name that :class:`cwlens.reducers.HeadSummary` used for
another quantity) and the factor split ``sink_*`` / ``tail_*``. Now every name means one
quantity (docs/sinks.md, "Columns"): ``sink_contribution_intra``,
``sink_contribution_intra_median``, ``sink_contribution_inter``, ``split_sink_*``,
``split_tail_*``. ``cwlens sinks --plot-only`` reads either form; this makes the files
themselves match. Every value is copied as the text it was stored as, and the folder's
``tables.json`` checksums are updated. The shipped results were upgraded with::

    python scripts/upgrade_sink_tables.py results/replicate/*/sinks
"""

import argparse
import sys

from cwlens.sinks.store import upgrade_folder


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", help="output folders of `cwlens sinks` (--out)")
    args = p.parse_args(argv)
    for folder in args.folders:
        done = upgrade_folder(folder)
        print(f"{folder}: " + (", ".join(p.name for p in done) if done else "already current"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
