"""The HTML report in a real browser: headless Chromium renders it with no console errors,
no network requests, and the graph, stage table and timeline visible.

Chromium is driven through the DevTools protocol over a pipe (``--remote-debugging-pipe``:
JSON messages separated by NUL bytes on file descriptors 3 and 4), so no port is
opened and no extra package is needed. CI installs Debian's ``chromium``.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import test_report_fixtures as fx
from placer.report import write_report

CHROMIUM = next((p for p in (os.environ.get("PLACER_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                             shutil.which("chromium-browser")) if p and os.path.exists(p)), None)
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)"),
]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--remote-debugging-pipe"]


class Browser:
    """A minimal DevTools client over Chromium's debugging pipe."""

    def __init__(self, profile_dir: Path):
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()

        def as_fds_3_and_4():  # in the child: the pipe ends Chromium expects
            hi_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
            hi_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile_dir}", "about:blank"],
            pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=as_fds_3_and_4,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []
        self.session = None

    def send(self, method: str, params: dict | None = None, timeout: float = 30.0) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if self.session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read(timeout)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict:
        while True:
            for i, e in enumerate(self.events):
                if e.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read(timeout))

    def _read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buf:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise TimeoutError("no answer from Chromium")
            os.set_blocking(self._r, True)
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise TimeoutError("Chromium closed the pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def open(self, url: str, width: int = 1400, height: int = 1000) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        self.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str):
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return res["result"].get("value")

    def close(self) -> None:
        try:
            self.session = None
            self.send("Browser.close", timeout=5)
        except (TimeoutError, RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._w)
        os.close(self._r)


VISIBLE = """JSON.stringify(Object.fromEntries(%s.map(sel => {
  const el = document.querySelector(sel);
  if (!el) return [sel, null];
  const r = el.getBoundingClientRect(), s = getComputedStyle(el);
  return [sel, {w: r.width, h: r.height, shown: s.display !== 'none' && s.visibility !== 'hidden' && s.opacity !== '0',
                rows: el.querySelectorAll ? el.querySelectorAll('tbody tr').length : 0,
                shapes: el.querySelectorAll ? el.querySelectorAll('path, use').length : 0}];
})))"""
SECTIONS = ["#summary-table", "#fig-dag", "#stage-table", "#fig-timeline", "#fig-errors", "#advice"]


def test_report_renders_in_chromium_without_errors(tmp_path):
    facts = fx.facts()
    page = write_report(facts, tmp_path / "report.html")
    browser = Browser(tmp_path / "chromium-profile")
    try:
        browser.open(page.resolve().as_uri())
        boxes = json.loads(browser.evaluate(VISIBLE % json.dumps(SECTIONS)))
        height = browser.evaluate("document.documentElement.scrollHeight")
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": 1400, "height": int(height), "deviceScaleFactor": 1, "mobile": False})
        shot = browser.send("Page.captureScreenshot", {"format": "png"})
        events = list(browser.events)
    finally:
        browser.close()
    (tmp_path / "report.png").write_bytes(base64.b64decode(shot["data"]))
    errors = [e for e in events if e.get("method") == "Runtime.exceptionThrown"
              or (e.get("method") == "Runtime.consoleAPICalled" and e["params"].get("type") in ("error", "assert"))
              or (e.get("method") == "Log.entryAdded" and e["params"]["entry"].get("level") == "error")]
    assert not errors, errors
    requests = [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]
    assert all(u.startswith(("file:", "data:", "about:")) for u in requests), requests
    for sel in SECTIONS:
        box = boxes[sel]
        assert box is not None, f"{sel} missing"
        assert box["shown"] and box["w"] > 300 and box["h"] > 20, (sel, box)
    assert boxes["#stage-table"]["rows"] == len(facts.stages)
    assert boxes["#fig-dag"]["shapes"] > len(facts.stages)  # boxes, arrows, glyphs drawn
    assert (tmp_path / "report.png").stat().st_size > 10_000
