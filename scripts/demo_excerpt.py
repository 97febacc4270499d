"""Print the README's demo excerpt from a real run of the demo (not typed by hand: the
excerpt listed L18H7 first while the run listed L17H4).

    python scripts/demo_excerpt.py                  # run the demo (no PNG), print the block
    python scripts/demo_excerpt.py --from out.txt   # from a saved `cwlens demo` output

It prints the text that goes between the README's ``demo-excerpt`` markers (no tool writes
into the README: tests/test_readme.py); ``tests/test_newcomer.py`` runs the demo and checks
that the README holds it.
"""

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path


def main(argv=None) -> int:
    from cwlens.report.demo import readme_excerpt, run_demo

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="source", help="a saved output of `cwlens demo`")
    args = p.parse_args(argv)
    if args.source:
        printed = Path(args.source).read_text(encoding="utf-8")
    else:
        out = io.StringIO()
        with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(out):
            run_demo(out_dir=tmp, png=False)
        printed = out.getvalue()
    print(readme_excerpt(printed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
