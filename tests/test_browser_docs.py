"""The docs site, built and opened from disk in headless Chromium with the network cut (#41.4):
every page loads without a console error, every link inside the site reaches a page (a
file, not a folder: from disk, ``api/`` was a directory listing) and the anchor it names,
and the search works (mkdocs.yml: the ``offline`` plugin with its shim shipped, no fonts
from the network)."""

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from ._browser import browser_page, chromium_or_skip, open_file

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    chromium_or_skip()  # before the build: no browser, nothing to check
    built = os.environ.get("CWLENS_SITE_DIR")  # scripts/test.sh has just built it (--strict)
    if built and (Path(built) / "index.html").is_file():
        return Path(built)
    mkdocs = Path(sys.executable).parent / "mkdocs"
    if not mkdocs.exists():
        pytest.skip("mkdocs is not installed (the dev extra)")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run([str(mkdocs), "build", "--quiet", "--site-dir", str(out)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def visited(site):
    """Every page of the site opened once: ``{page: (links, problems)}``."""
    # 404.html is a web server's page for a missing URL (its links are from the server's root)
    pages = sorted(p for p in site.rglob("*.html") if "assets" not in p.parts and p.name != "404.html")
    out = {}
    with browser_page() as (page, log):
        for path in pages:
            open_file(page, path, settle_ms=200)
            title = page.title()
            links = page.evaluate("Array.from(document.links).map(a => a.href)")
            out[path] = (title, links, log.problems())
            log.errors.clear()
            log.blocked.clear()
    return out


def test_every_page_loads_offline_without_an_error(site, visited):
    assert len(visited) >= 20 and (site / "index.html") in visited and (site / "api.html") in visited
    bad = {str(p.relative_to(site)): problems for p, (_, _, problems) in visited.items() if problems}
    assert bad == {}
    assert all(title for title, _, _ in visited.values())


def test_every_link_inside_the_site_reaches_a_page_and_its_anchor(site, visited):
    ids: dict[Path, set[str]] = {}
    broken = []
    for page, (_, links, _) in visited.items():
        for link in links:
            url = urlsplit(link)
            if url.scheme != "file":
                continue
            target = Path(unquote(url.path))
            if not target.is_file():  # a folder opens as a directory listing from disk
                broken.append(f"{page.relative_to(site)} -> {link}")
                continue
            if url.fragment and target.suffix == ".html":
                if target not in ids:
                    ids[target] = set(re.findall(r'\bid="([^"]+)"', target.read_text(encoding="utf-8")))
                if unquote(url.fragment) not in ids[target]:
                    broken.append(f"{page.relative_to(site)} -> {link} (no such anchor)")
    assert broken == []
    assert sum(len(links) for _, links, _ in visited.values()) > 500  # the nav alone links every page


def test_the_search_works_from_disk(site):
    with browser_page() as (page, log):
        open_file(page, site / "index.html", settle_ms=500)
        box = page.locator("input.md-search__input")
        box.click()
        box.press_sequentially("contribution weights", delay=20)
        page.wait_for_selector(".md-search-result__item", timeout=20_000)
        hits = page.locator(".md-search-result__item").count()
    assert hits > 0 and log.problems() == []
