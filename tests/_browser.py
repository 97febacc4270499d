"""Test helpers: read a PNG with the standard library, screenshot a page with headless
Chromium, and drive the system Chromium with playwright (:func:`browser_page`)."""

import struct
import subprocess
import tempfile
import zlib
from contextlib import contextmanager
from pathlib import Path


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _unfilter(kind, line, prev, ch):
    for x in range(len(line)):
        left = line[x - ch] if x >= ch else 0
        up_left = prev[x - ch] if x >= ch else 0
        if kind == 1:
            line[x] = (line[x] + left) & 255
        elif kind == 2:
            line[x] = (line[x] + prev[x]) & 255
        elif kind == 3:
            line[x] = (line[x] + (left + prev[x]) // 2) & 255
        elif kind == 4:
            line[x] = (line[x] + _paeth(left, prev[x], up_left)) & 255
    return line


def read_png(path):
    """``(width, height, channels, rows)`` of an 8-bit, non-interlaced PNG."""
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG")
    pos, idat, header = 8, [], None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, chunk = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat.append(chunk)
    w, h, depth, ctype, _, _, interlace = header
    if depth != 8 or interlace or ctype not in (0, 2, 4, 6):
        raise ValueError(f"unsupported PNG: depth={depth} colour type={ctype}")
    ch = {0: 1, 2: 3, 4: 2, 6: 4}[ctype]
    raw, stride = zlib.decompress(b"".join(idat)), w * ch
    rows, prev = [], bytearray(stride)
    for y in range(h):
        start = y * (stride + 1)
        line = _unfilter(raw[start], bytearray(raw[start + 1 : start + 1 + stride]), prev, ch)
        rows.append(bytes(line))
        prev = line
    return w, h, ch, rows


def png_stats(path, step=8):
    """Distinct colours and luminance spread on a pixel grid: a blank page has 1 colour, 0 spread."""
    w, h, ch, rows = read_png(path)
    colours, lum = set(), []
    for y in range(0, h, step):
        for x in range(0, w, step):
            px = rows[y][x * ch : x * ch + min(ch, 3)]
            colours.add(px)
            lum.append(sum(px) / len(px))
    mean = sum(lum) / len(lum)
    spread = (sum((v - mean) ** 2 for v in lum) / len(lum)) ** 0.5
    return {"width": w, "height": h, "colours": len(colours), "stddev": spread}


def screenshot_html(html_path, png_path, width=1200, height=900, timeout=120):
    """Screenshot a local page; returns ``(console lines, error lines)`` from the browser log."""
    from cwlens.plotting.export import find_chrome

    chrome = find_chrome()
    with tempfile.TemporaryDirectory() as profile:
        cmd = [
            chrome, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--hide-scrollbars", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
            f"--screenshot={Path(png_path).resolve()}", f"--window-size={width},{height}",
            Path(html_path).resolve().as_uri(),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0 or not Path(png_path).exists():
        raise RuntimeError(f"{chrome} wrote no screenshot (rc={res.returncode}): "
                           f"stdout {res.stdout[-1000:]!r} stderr {res.stderr[-2000:]!r}")
    console = [line for line in res.stderr.splitlines() if ":CONSOLE" in line]
    return console, [line for line in console if "Uncaught" in line or "Error" in line]


# --- a real browser, driven by playwright-python (the system Chromium, never a download) ---

BROWSER_ARGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)


def chromium_or_skip() -> str:
    """The system Chromium for playwright, or skip with the reason (fail under CI, where
    scripts/setup.sh installs both Chromium and playwright)."""
    import importlib.util
    import os

    import pytest

    from cwlens.plotting.export import find_chrome

    chrome = find_chrome()
    missing = None
    if chrome is None:
        missing = "no Chromium on PATH (scripts/setup.sh installs it: apt-get install chromium)"
    elif importlib.util.find_spec("playwright") is None:
        missing = "playwright is not installed (pip install playwright; part of the dev extra)"
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)
    return str(chrome)


class PageLog:
    """What went wrong on a page: console errors, uncaught exceptions, requests that failed
    or left the machine (every non-``file:`` request is blocked: the page must work offline)."""

    def __init__(self):
        self.errors: list[str] = []
        self.blocked: list[str] = []

    def problems(self) -> list[str]:
        return self.errors + [f"network request (blocked, the page must work offline): {u}"
                              for u in self.blocked]


def _route(log: PageLog):
    def handle(route):
        url = route.request.url
        if url.startswith(("file:", "data:", "blob:", "about:")):
            route.continue_()
        else:
            log.blocked.append(url)
            route.abort()

    return handle


@contextmanager
def browser_page(width: int = 1400, height: int = 1000):
    """``(page, log)``: a fresh headless Chromium (new user-data-dir) whose network is cut
    (only ``file:`` and inline URLs load) and whose console errors land in ``log``."""
    from playwright.sync_api import sync_playwright

    chrome = chromium_or_skip()
    log = PageLog()
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=chrome, args=list(BROWSER_ARGS), headless=True,
            viewport={"width": width, "height": height})
        try:
            page = context.new_page()
            page.on("console", lambda m: log.errors.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "assert") else None)
            page.on("pageerror", lambda e: log.errors.append(f"uncaught: {e}"))
            page.on("requestfailed", lambda r: log.errors.append(f"request failed: {r.url}")
                    if r.url not in log.blocked else None)
            page.route("**/*", _route(log))
            yield page, log
        finally:
            context.close()


def open_file(page, path, settle_ms: int = 500) -> None:
    """Load a local file and wait until it has loaded and settled."""
    page.goto(Path(path).resolve().as_uri(), wait_until="load")
    page.wait_for_timeout(settle_ms)
