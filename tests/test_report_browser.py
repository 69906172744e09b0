"""The report in a real browser: headless Chromium over the DevTools protocol.

Checks that the page loads offline with no console errors or uncaught exceptions, that
every plotly figure rendered (an SVG with drawn traces), that the screenshot is not blank,
and that markup in a model name did not run. Needs Debian's ``chromium`` (apt-get install
chromium); skipped without it.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import shutil
import subprocess
import time
import urllib.request

import pytest

from _synth import make_profile
from throughputlab.fit import fit_profile
from throughputlab.models import resolve_model
from throughputlab.predict import predict_analytic
from throughputlab.report.profile_report import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.browser, pytest.mark.skipif(CHROMIUM is None, reason="headless chromium is not installed")]

EVIL = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'

PROBE_JS = """(() => {
  const plots = [...document.querySelectorAll('.js-plotly-plot')];
  return JSON.stringify({
    plots: plots.length,
    rendered: plots.map(p => ({svg: p.querySelectorAll('svg.main-svg').length,
                               traces: p.querySelectorAll('.scatterlayer .trace').length,
                               points: p.querySelectorAll('.scatterlayer path').length})),
    pwned: window.__pwned === undefined ? null : window.__pwned,
    title: document.title,
  });
})()"""


class _Chromium:
    """One headless Chromium with a DevTools port; closed by its own pid."""

    def __init__(self, tmp_path):
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-default-apps",
             "--host-resolver-rules=MAP * ~NOTFOUND",  # offline: any host lookup fails
             f"--user-data-dir={tmp_path / 'profile'}", "--remote-debugging-port=0", "--window-size=1280,2400",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.port = self._port()

    def _port(self) -> int:
        deadline = time.time() + 30
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line or "")
            if m:
                return int(m.group(1))
            if not line and self.proc.poll() is not None:
                break
        raise RuntimeError("chromium did not start its DevTools endpoint")

    def page_ws(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as r:
            targets = json.load(r)
        return next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def _inspect(ws_url: str, url: str) -> dict:
    import websockets

    errors, requests = [], []
    async with websockets.connect(ws_url, max_size=64 * 2**20) as ws:
        next_id = 0
        pending: dict[int, asyncio.Future] = {}
        loaded = asyncio.get_running_loop().create_future()

        async def reader():
            async for raw in ws:
                msg = json.loads(raw)
                if "id" in msg and msg["id"] in pending:
                    pending.pop(msg["id"]).set_result(msg)
                    continue
                method, params = msg.get("method"), msg.get("params", {})
                if method == "Runtime.exceptionThrown":
                    errors.append(params["exceptionDetails"].get("exception", {}).get("description")
                                  or params["exceptionDetails"].get("text"))
                elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                    errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
                elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                    errors.append(params["entry"]["text"])
                elif method == "Network.requestWillBeSent":
                    requests.append(params["request"]["url"])
                elif method == "Page.loadEventFired" and not loaded.done():
                    loaded.set_result(True)

        async def call(method, **params):
            nonlocal next_id
            next_id += 1
            fut = asyncio.get_running_loop().create_future()
            pending[next_id] = fut
            await ws.send(json.dumps({"id": next_id, "method": method, "params": params}))
            msg = await asyncio.wait_for(fut, 30)
            if "error" in msg:
                raise RuntimeError(f"{method}: {msg['error']}")
            return msg.get("result", {})

        task = asyncio.create_task(reader())
        for domain in ("Runtime", "Log", "Page", "Network"):
            await call(f"{domain}.enable")
        errors.clear()  # enabling replays what an earlier page logged; only this page counts
        requests.clear()
        await call("Page.navigate", url=url)
        await asyncio.wait_for(loaded, 30)
        await asyncio.sleep(1.5)  # plotly draws after load; let it finish
        probe = json.loads((await call("Runtime.evaluate", expression=PROBE_JS, returnByValue=True))["result"]["value"])
        shot = await call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        task.cancel()
    return {"errors": errors, "requests": requests, "probe": probe, "png": base64.b64decode(shot["data"])}


def _not_blank(png: bytes) -> float:
    """Share of pixels that are not the background colour."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    img.thumbnail((400, 800))
    px = list(img.getdata())
    bg = max(set(px), key=px.count)
    return sum(1 for p in px if sum(abs(a - b) for a, b in zip(p, bg)) > 30) / len(px)


def test_report_renders_in_headless_chromium(tmp_path):
    measured = make_profile(concurrencies=(1, 2, 4, 8, 16, 32), micro_batches=(1, 2, 4), name=EVIL, noise=0.01)
    measured.fit = fit_profile(measured).model_dump(mode="json")
    pred = predict_analytic(resolve_model("demo").spec, "l4", concurrency=(1, 8, 64))
    path = tmp_path / "report.html"
    write_report([measured, pred], path)

    browser = _Chromium(tmp_path)
    try:
        result = asyncio.run(_inspect(browser.page_ws(), path.as_uri()))
    finally:
        browser.close()

    assert result["errors"] == [], result["errors"]
    assert [u for u in result["requests"] if not u.startswith(("file:", "data:", "about:"))] == []
    probe = result["probe"]
    assert probe["pwned"] is None, "markup from the model name ran in the page"
    assert probe["plots"] == 4
    for fig in probe["rendered"]:
        assert fig["svg"] >= 1 and fig["traces"] >= 2 and fig["points"] >= 2, fig
    assert "<script>" in probe["title"]  # shown as text in the title, not run
    assert _not_blank(result["png"]) > 0.02
