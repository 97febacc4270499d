"""Time the contribution-graph page in headless Chromium (network cut): page size, the
viewer's first drawing done and the load event, both on the page's own clock from the start
of the navigation, best of ``--repeats`` loads in one browser. Synthetic graphs (30 layers,
top-k 8, two metrics, random edges) of the sizes given, and any saved pages named with
``--page`` (e.g. one made by ``cwlens graph --file ... --max-tokens 4096``).

    python scripts/benchmark_graph_page.py [--positions 512 4096 8192] [--page PAGE.html ...]
                                           [--repeats 3] [--docs docs/graph.md]

Timing lives here, not in the tests (tests/test_browser_graph.py checks that these pages
open and draw without an error). Run it with nothing else on the cores.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- graph-page:start -->", "<!-- graph-page:end -->"


def time_page(page, log, path: Path) -> dict:
    """One load of ``path``: the viewer's ready time and the load event (ms, page clock)."""
    start = time.perf_counter()
    page.goto(path.resolve().as_uri(), wait_until="load")
    page.wait_for_function("window.cwlensGraph && window.cwlensGraph.readyMs > 0")
    wall = time.perf_counter() - start
    info = page.evaluate("({ready: window.cwlensGraph.readyMs, edges: window.cwlensGraph.visibleEdges(),"
                         " load: performance.getEntriesByType('navigation')[0].loadEventEnd})")
    if log.problems():
        raise RuntimeError(f"{path}: the page reported {log.problems()}")
    return {**info, "wall": wall}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--positions", type=int, nargs="*", default=[512, 4096, 8192],
                        help="synthetic graphs of 30 layers x this many positions")
    parser.add_argument("--page", nargs="*", default=[], help="saved graph pages to time too")
    parser.add_argument("--repeats", type=int, default=3, help="loads per page (best is reported)")
    parser.add_argument("--docs", default=None, help=f"write the table into this page's {START} block")
    args = parser.parse_args(argv)
    if args.repeats < 1 or any(n < 2 for n in args.positions):
        parser.error("--repeats must be >= 1 and every --positions >= 2")
    missing = [p for p in args.page if not Path(p).is_file()]
    if missing:
        parser.error(f"--page: no such file: {', '.join(missing)} (make one with cwlens graph --out)")

    sys.path.insert(0, str(ROOT))
    from cwlens.testing import synthetic_graph
    from tests._browser import browser_page

    rows = []
    with tempfile.TemporaryDirectory() as tmp, browser_page(1400, 850) as (page, log):
        pages = []
        for n in args.positions:
            path = synthetic_graph(n_layers=30, n=n, top_k=8).save(Path(tmp) / f"graph_{n}.html")
            pages.append((f"30 layers × {n:,} positions, top-k 8, two metrics (synthetic)", path))
        pages += [(f"`{Path(p).name}`", Path(p)) for p in args.page]
        for name, path in pages:
            runs = [time_page(page, log, path) for _ in range(args.repeats)]
            best = min(runs, key=lambda r: max(r["ready"], r["load"]))
            row = (name, path.stat().st_size / 1e6, best["ready"] / 1e3, best["load"] / 1e3, best["edges"])
            rows.append(row)
            print(f"{name}: {row[1]:.1f} MB, first drawing {row[2]:.2f} s, load event {row[3]:.2f} s, "
                  f"{row[4]:,} edges shown (best of {args.repeats})", flush=True)
    table = "\n".join(["| graph | page | first drawing done | load event | edges shown (default threshold) |",
                       "|---|---|---|---|---|"]
                      + [f"| {n} | {mb:.1f} MB | {r:.2f} s | {ld:.2f} s | {e:,} |" for n, mb, r, ld, e in rows])
    print(table)
    if args.docs:
        from cwlens.faithfulness.report import write_block

        cmd = "python scripts/benchmark_graph_page.py " + " ".join(argv if argv is not None else sys.argv[1:])
        write_block(args.docs, f"`{cmd.strip()}` (best of {args.repeats} loads):\n\n{table}", START, END)
        print(f"wrote the table into {args.docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
