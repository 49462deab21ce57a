"""The gateway's web page (GET /, issue 24) in a real browser: Debian's chromium, headless, driven through the Chrome
DevTools Protocol (its own WebSocket; no browser download, no Playwright). A person's steps: type the key and a
sentence, press Enter, hear it (Web Audio: the chunks scheduled back to back), see the TTFA the gateway measured;
press Escape mid-reply; a wrong key says so. A screenshot of the page is saved (its path is printed) for a person to
look at. `make tools` installs chromium; without it these tests skip and say why."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from conftest import left_held, own_gateway

from services.stack import free_port

KEY = "alpha"
CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser") if shutil.which(name)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make tools installs it as root)")


@pytest.fixture(scope="module")
def gateway(stack, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(KEY + "\n")
    with own_gateway(stack, tmp_path_factory.mktemp("logs"), "--api-keys-file", str(keys), http=True) as gw:
        yield gw


class Page:
    """One browser tab, through the DevTools protocol."""

    def __init__(self, http: aiohttp.ClientSession, ws, devtools: str, target: str):
        self.http, self.ws, self.devtools, self.target, self.ids = http, ws, devtools, target, itertools.count(1)

    async def close(self) -> None:
        """Close the tab (its WebSocket session with it) and the protocol's connection."""
        async with self.http.get(f"{self.devtools}/json/close/{self.target}"):
            pass
        await self.ws.close()
        await self.http.close()

    async def call(self, method: str, **params):
        n = next(self.ids)
        await self.ws.send_json({"id": n, "method": method, "params": params})
        while True:
            msg = await asyncio.wait_for(self.ws.receive_json(), 30)
            if msg.get("id") == n:
                assert "error" not in msg, msg
                return msg["result"]

    async def js(self, expression: str):
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    async def until(self, expression: str, timeout: float = 60.0, what: str = ""):
        deadline = time.monotonic() + timeout
        while not (value := await self.js(expression)):
            assert time.monotonic() < deadline, what or expression
            await asyncio.sleep(0.05)
        return value

    async def type(self, selector: str, text: str) -> None:
        """Focus a field, clear it and type into it, as a keyboard does."""
        await self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.focus(); e.select(); }})()")
        await self.call("Input.insertText", text=text)
        await self.js(f"document.querySelector({json.dumps(selector)}).dispatchEvent(new Event('change'))")

    async def key(self, key: str, code: int) -> None:
        for kind in ("keyDown", "keyUp"):
            await self.call("Input.dispatchKeyEvent", type=kind, key=key, code=key, windowsVirtualKeyCode=code)

    async def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode((await self.call("Page.captureScreenshot", format="png"))["data"]))
        return path


@pytest.fixture(scope="module")
def chromium(tmp_path_factory):
    """A headless chromium with a DevTools port: → its port."""
    port, profile = free_port(), tmp_path_factory.mktemp("chromium-profile")
    proc = subprocess.Popen([CHROMIUM, "--headless=new", f"--remote-debugging-port={port}", "--remote-allow-origins=*",
                             f"--user-data-dir={profile}", "--no-sandbox", "--no-first-run", "--disable-gpu",
                             "--autoplay-policy=no-user-gesture-required", "--window-size=1000,1100", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/version", timeout=1):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "chromium did not start"
                time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


async def open_page(port: int, url: str) -> Page:
    """A new tab at `url`, loaded."""
    http, devtools = aiohttp.ClientSession(), f"http://127.0.0.1:{port}"
    async with http.put(f"{devtools}/json/new?about:blank") as r:
        target = await r.json()
    page = Page(http, await http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0), devtools, target["id"])
    await page.call("Page.enable")
    await page.call("Page.navigate", url=url)
    await page.until("document.readyState === 'complete' && !!window.mossPage", 30, "the page did not load")
    return page


def screenshot_dir(tmp_path: Path) -> Path:
    where = Path(os.environ.get("MOSS_SCREENSHOTS", tmp_path))
    where.mkdir(parents=True, exist_ok=True)
    return where


def test_a_person_types_hears_the_reply_and_stops_the_next(gateway, stack, chromium, tmp_path):
    async def scenario():
        page = await open_page(chromium, f"http://127.0.0.1:{gateway.http}/")
        try:
            await page.type("#key", KEY)
            await page.type("#max-tokens", "24")
            await page.type("#text", "Hello there, how are you today?")
            await page.key("Enter", 13)
            turn = await page.until("(() => { const t = mossPage.turns[0]; return t && t.summary && t; })()", 60,
                                    "the reply never completed")
            assert not await page.js("mossPage.errors.length"), await page.js("mossPage.errors")
            chunks = turn["chunks"]
            assert len(chunks) > 1, "the audio should arrive in several chunks"
            assert sum(c["samples"] for c in chunks) == int(turn["summary"]["num_samples"]) > 0  # every sample played
            assert not any(c["late"] for c in chunks), chunks
            for before, after in zip(chunks, chunks[1:]):  # gapless: each chunk starts where the last ends
                assert abs(after["start"] - before["end"]) < 1e-6
            server_ms = turn["summary"]["ttfa_seconds"] * 1000
            assert server_ms <= turn["ttfa"] <= server_ms + 150, (turn["ttfa"], server_ms)  # the browser's own lag
            shown = await page.js("document.getElementById('ttfa').textContent")
            assert shown.endswith(" ms") and abs(float(shown[:-3]) - turn["ttfa"]) <= 1
            shown_server = await page.js("document.getElementById('ttfa-server').textContent")
            assert shown_server.endswith(" ms") and abs(float(shown_server[:-3]) - server_ms) <= 1
            print(f"\nscreenshot: {await page.screenshot(screenshot_dir(tmp_path) / 'web_page_reply.png')}")

            # a long reply, stopped with Escape once it plays
            await page.type("#max-tokens", "1500")
            await page.type("#text", "Now tell me a very long story.")
            await page.key("Enter", 13)
            await page.until("mossPage.turns.length === 2 && mossPage.turns[1].chunks.length > 0", 60, "no audio")
            await page.key("Escape", 27)
            await page.until("document.getElementById('status').textContent === 'Reply stopped.'", 30,
                             "the page did not say the reply stopped")
            heard = await page.js("mossPage.turns[1].chunks.length")
            await asyncio.sleep(0.5)
            assert await page.js("mossPage.turns[1].chunks.length") == heard  # nothing more of it plays
        finally:
            await page.close()

    asyncio.run(scenario())
    deadline = time.monotonic() + 20
    while any((held := left_held(gateway, stack)).values()):  # the tab closed: its session and turns are gone
        assert time.monotonic() < deadline, held
        time.sleep(0.05)


def test_a_wrong_key_is_said_plainly(gateway, chromium, tmp_path):
    async def scenario():
        page = await open_page(chromium, f"http://127.0.0.1:{gateway.http}/")
        try:
            await page.type("#key", "not-the-key")
            await page.type("#text", "Hello?")
            await page.key("Enter", 13)
            await page.until("mossPage.errors.length > 0", 30, "no error shown")
            shown = await page.js("document.getElementById('status').textContent")
            assert "API key was refused" in shown
            assert await page.js("document.getElementById('status').className") == "error"
            assert await page.js("mossPage.turns.length") == 0
            await page.screenshot(screenshot_dir(tmp_path) / "web_page_bad_key.png")
        finally:
            await page.close()

    asyncio.run(scenario())
