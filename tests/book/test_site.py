"""The built website: every internal link and picture resolves, nothing comes from the network, every page of
book.yml is there with its pictures and is found by the search index."""
from __future__ import annotations

import functools
import html
import http.server
import json
import os
import posixpath
import re
import select
import shutil
import subprocess
import threading
import time
import warnings
from types import SimpleNamespace

import pytest

from tests.book.conftest import ROOT

# Broken links the book reports but cannot fix, each with where it comes from. The test fails on any other broken
# link, and on an entry here that no longer happens (delete it then).
KNOWN_BROKEN: dict[str, str] = {}


@pytest.fixture(scope="module")
def site(builder):
    start = time.perf_counter()
    stager = builder.build(ROOT, builder.OUT, quiet=True)
    return SimpleNamespace(path=builder.OUT / "site", stager=stager, seconds=time.perf_counter() - start)


def test_the_site_builds_in_bounded_time(site):
    assert (site.path / "index.html").is_file()
    assert site.seconds < 60, f"make book took {site.seconds:.0f} s"


def test_every_internal_link_and_picture_resolves(builder, site):
    problems = site.stager.problems + builder.check_site(site.path)
    broken = [p for p in problems if p not in KNOWN_BROKEN]
    assert not broken, f"{len(broken)} broken links or pictures:\n" + "\n".join(broken)
    fixed = [p for p in KNOWN_BROKEN if p not in problems]
    assert not fixed, "fixed, so delete from KNOWN_BROKEN:\n" + "\n".join(fixed)
    for problem in KNOWN_BROKEN:
        warnings.warn(f"known broken link: {problem} ({KNOWN_BROKEN[problem]})", stacklevel=1)


def test_the_link_check_finds_a_broken_link_an_anchor_and_a_remote_script(builder, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "index.html").write_text('<h2 id="here">x</h2><a href="a/b.html#there">b</a><a href="#here">h</a>'
                                         '<a href="https://example.org/">fine: a link out</a>'
                                         '<img src="gone.svg"><script src="https://cdn.example.org/x.js"></script>')
    (tmp_path / "a" / "b.html").write_text('<a href="../index.html#here">back</a><a href="../">home</a>')
    assert builder.check_site(tmp_path) == [
        "index.html: link a/b.html#there: a/b.html has no #there",
        "index.html: resource gone.svg leads nowhere",
        "index.html: loads https://cdn.example.org/x.js from the network",
    ]


def test_nothing_is_fetched_from_the_network(site):
    remote = re.compile(r"@import\s+(url\()?[\"']?https?:|url\([\"']?https?:|fonts\.googleapis|fonts\.gstatic")
    offenders = [p.relative_to(site.path).as_posix() for p in site.path.rglob("*")
                 if p.suffix in (".html", ".css") and remote.search(p.read_text(errors="replace"))]
    assert not offenders, f"these files load fonts or styles from the network: {offenders}"


def test_every_page_is_built_and_searchable(builder, site):
    book = builder.load_book(ROOT)
    index = json.loads((site.path / "search" / "search_index.json").read_text())
    searchable = {doc["location"].split("#")[0] for doc in index["docs"]}
    for page in book.pages:
        url = builder.page_url(page)
        assert (site.path / url).is_file(), f"{page} was not built into {url}"
        assert url in searchable or (url == "index.html" and "" in searchable), f"{url} is not in the search index"


def test_notebooks_show_their_committed_outputs(builder, site):
    for page in builder.load_book(ROOT).pages:
        if not page.endswith(".ipynb"):
            continue
        nb = json.loads((ROOT / page).read_text())
        pictures = sum(1 for cell in nb["cells"] for out in cell.get("outputs", [])
                       if {"image/png", "image/svg+xml"} & set(out.get("data", {})))
        html = (site.path / builder.page_url(page)).read_text()
        shown = html.count("data:image/png") + html.count("<svg")
        assert shown >= pictures, f"{page}: {pictures} pictures in its outputs, {shown} on its page"
        assert "jp-OutputArea" in html, f"{page}: no output cells on its page"


# ------------------------------------------------------------------------------------------------ in a browser
@pytest.fixture(scope="module")
def chromium():
    """Debian's Chromium, installed by scripts/chromium.sh where it is missing; a skip that says why where the
    machine cannot install it (pytest -ra prints the reason)."""
    found = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if found:
        return found
    run = subprocess.run(["bash", str(ROOT / "scripts" / "chromium.sh")], capture_output=True, text=True, timeout=900)
    lines = run.stdout.split()
    if run.returncode or not lines:
        why = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else f"it exited {run.returncode}"
        pytest.skip(f"the browser test needs Chromium, which scripts/chromium.sh could not install here: {why}")
    return lines[-1]


@pytest.fixture(scope="module")
def server(site):
    """The site over HTTP on 127.0.0.1, as `python -m http.server` serves it to a reader."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site.path)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    thread.join()


def _text(html_fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", html_fragment)).replace("¶", "").split())


def _flags(profile) -> list[str]:
    """Headless, offline (every host name but 127.0.0.1 fails to resolve: a page that needs the network shows it)."""
    sandbox = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium's sandbox refuses to run as root
    return ["--headless", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars", "--no-first-run",
            f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", *sandbox]


def _render(chromium: str, url: str, png, profile) -> subprocess.CompletedProcess:
    """One headless Chromium run: a screenshot of `url` into `png`, and its DOM, after scripts ran, on stdout.
    Tried twice: on a loaded machine a browser start can fail for reasons of its own."""
    cmd = [chromium, *_flags(profile), "--window-size=1280,1600", f"--screenshot={png}", "--dump-dom", url]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return run if run.returncode == 0 else subprocess.run(cmd, capture_output=True, text=True, timeout=60)


class DevTools:
    """Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: commands on its fd 3, answers
    on its fd 4, each a JSON object ending in NUL), with nothing but the standard library."""

    def __init__(self, chromium: str, profile):
        to_chrome, self._write = os.pipe()
        self._read, from_chrome = os.pipe()
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{to_chrome} 4>&{from_chrome}', chromium, *_flags(profile),
             "--remote-debugging-pipe", "about:blank"],
            pass_fds=(to_chrome, from_chrome), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome)
        os.close(from_chrome)
        self._buffer, self._id, self.events = b"", 0, []

    def send(self, method: str, session: str | None = None, timeout: float = 30, **params):
        self._id += 1
        message = {"id": self._id, "method": method, "params": params} | ({"sessionId": session} if session else {})
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._next(timeout)
            if reply.get("id") == self._id:
                assert "error" not in reply, f"{method}: {reply['error']}"
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, event: str, timeout: float = 30) -> dict:
        while True:
            found = next((e for e in self.events if e.get("method") == event), None)
            if found:
                self.events.remove(found)
                return found
            self.events.append(self._next(timeout))

    def _next(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            assert left > 0 and select.select([self._read], [], [], left)[0], "Chromium did not answer in time"
            chunk = os.read(self._read, 1 << 16)
            assert chunk, "Chromium closed its DevTools pipe"
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self):
        os.close(self._write)
        os.close(self._read)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


SEARCH_RESULTS = """new Promise(done => { const start = Date.now(); (function poll() {
  const hits = [...document.querySelectorAll('.md-search-result__item a')].map(a => a.getAttribute('href'));
  if (hits.length || Date.now() - start > 20000) done(hits); else setTimeout(poll, 100); })(); })"""


def test_search_finds_a_chapter_offline(builder, site, server, chromium, tmp_path):
    """The site's own search, in the browser with no network: searching `radix` lists pages, chapter 4's among them."""
    browser = DevTools(chromium, tmp_path / "profile")
    try:
        target = browser.send("Target.createTarget", url="about:blank")["targetId"]
        session = browser.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        browser.send("Page.enable", session)
        browser.send("Page.navigate", session, url=server + "index.html?q=radix")
        browser.wait_for("Page.loadEventFired")
        hits = browser.send("Runtime.evaluate", session, timeout=40, expression=SEARCH_RESULTS, awaitPromise=True,
                            returnByValue=True)["result"]["value"]
    finally:
        browser.close()
    assert hits, "searching the site for 'radix' found nothing (no results within 20 s)"
    pages = sorted({h.removeprefix(server).split("?")[0] for h in hits})
    assert "step04_radix/index.html" in pages, f"chapter 4 is not among the results: {pages}"


def _variance(png) -> float:
    from PIL import Image, ImageStat

    return ImageStat.Stat(Image.open(png).convert("L")).var[0]


def test_a_blank_page_reads_as_blank(chromium, tmp_path):
    run = _render(chromium, "data:text/html,<html><body></body></html>", tmp_path / "blank.png", tmp_path / "p")
    assert run.returncode == 0, run.stderr[-300:]
    assert _variance(tmp_path / "blank.png") < 100


def test_each_chapter_opens_in_a_browser_with_its_title(builder, site, server, chromium, tmp_path):
    """Headless Chromium renders the first page of every chapter to build/book/screenshots/NN_PAGE.png: the picture
    is not blank and the page's first heading is the unit's title."""
    shots = builder.OUT / "screenshots"
    shutil.rmtree(shots, ignore_errors=True)
    shots.mkdir(parents=True)
    failures, start = [], time.perf_counter()
    for i, (_, pages) in enumerate(builder.load_book(ROOT).chapters):
        url = builder.page_url(pages[0])
        png = shots / f"{i:02d}_{url.removesuffix('.html').replace('/', '_')}.png"
        run = _render(chromium, server + url, png, tmp_path / "profile")
        if run.returncode or not png.is_file():
            failures.append(f"{url}: Chromium exited {run.returncode}: {run.stderr.strip()[-300:]}")
            continue
        variance = _variance(png)
        if variance < 100:
            failures.append(f"{url}: the screenshot {png} is blank (pixel variance {variance:.1f})")
        title = builder.page_title(ROOT / pages[0])
        headings = [_text(h) for h in re.findall(r"<h1\b.*?</h1>", run.stdout, re.S)]
        if " ".join(title.split()) not in headings:
            failures.append(f"{url}: the unit's title {title!r} is not its page's heading (headings: {headings})")
    assert not failures, "\n".join(failures)
    assert time.perf_counter() - start < 90, f"rendering the chapters took {time.perf_counter() - start:.0f} s"


def test_every_page_links_the_next_one_in_reading_order(builder, site):
    urls = [builder.page_url(p) for p in builder.load_book(ROOT).pages]
    footer = re.compile(r'<a href="([^"]*)" class="md-footer__link md-footer__link--next"')
    for here, after in zip(urls, urls[1:]):
        found = footer.findall((site.path / here).read_text())
        links = [posixpath.normpath(posixpath.join(posixpath.dirname(here), f)) for f in found]
        assert links == [after], f"{here}: its 'next' link goes to {links}, not to {after}"
