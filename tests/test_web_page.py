"""The gateway's web page (GET /) in a real browser: Debian's chromium, headless, driven through the Chrome
DevTools Protocol (its own WebSocket; no browser download, no Playwright). A person's steps: type the key and a
sentence, press Enter, hear it (Web Audio: the chunks scheduled back to back), see the TTFA the gateway measured;
press Escape mid-reply; talk into the microphone (chromium's fake capture device plays espeak-ng's speech) and hear
the reply, by hand and hands-free; a wrong key, a full gateway and a stage down say so. Screenshots of the page are
saved (their paths printed) for a person to look at. `make tools` installs chromium and espeak-ng; without them these
tests skip and say why."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import soundfile as sf
from conftest import left_held, metric_value, own_gateway, scrape, silent_speech_client
from speech import spoken

from services.stack import free_port

KEY = "alpha"
CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser") if shutil.which(name)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make tools installs it as root)")
SPEECH = "Hello there."
SPEECH_SECONDS = (0.2, 0.9)  # silence before and after the sentence in the microphone's file (the gate ends at 0.5 s)


@pytest.fixture(scope="module")
def gateway(stack, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(KEY + "\n")
    with own_gateway(stack, tmp_path_factory.mktemp("logs"), "--api-keys-file", str(keys),
                     "--encoder-target", stack.target("encoder"), http=True) as gw:
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

    async def key(self, key: str, code: int, ctrl: bool = False) -> None:
        for kind in ("keyDown", "keyUp"):
            await self.call("Input.dispatchKeyEvent", type=kind, key=key, code="Space" if key == " " else key,
                            windowsVirtualKeyCode=code, modifiers=2 if ctrl else 0)

    async def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode((await self.call("Page.captureScreenshot", format="png"))["data"]))
        return path


@pytest.fixture(scope="module")
def microphone(tmp_path_factory) -> Path | None:
    """What chromium's fake microphone says: espeak-ng's sentence between silences, as a WAV file (None without
    espeak-ng: the tests that talk skip then)."""
    try:
        samples, rate = spoken(SPEECH, *SPEECH_SECONDS)
    except pytest.skip.Exception:
        return None
    path = tmp_path_factory.mktemp("microphone") / "speech.wav"
    sf.write(path, samples, rate, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def chromium(tmp_path_factory, microphone):
    """A headless chromium with a DevTools port, whose microphone (allowed without asking) plays `microphone` once
    each time a page opens it: → its port."""
    with launched_chromium(tmp_path_factory, microphone) as port:
        yield port


@contextlib.contextmanager
def launched_chromium(tmp_path_factory, microphone: Path | None):
    port, profile = free_port(), tmp_path_factory.mktemp("chromium-profile")
    fake_mic = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={microphone}%noloop"] if microphone else []
    proc = subprocess.Popen([CHROMIUM, "--headless=new", f"--remote-debugging-port={port}", "--remote-allow-origins=*",
                             f"--user-data-dir={profile}", "--no-sandbox", "--no-first-run", "--disable-gpu",
                             "--autoplay-policy=no-user-gesture-required", "--window-size=1000,1100", *fake_mic,
                             "about:blank"],
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


def played_gaplessly(turn: dict) -> None:
    chunks = turn["chunks"]
    assert chunks and sum(c["samples"] for c in chunks) == int(turn["summary"]["num_samples"]) > 0
    assert not any(c["late"] for c in chunks), chunks
    for before, after in zip(chunks, chunks[1:]):
        assert abs(after["start"] - before["end"]) < 1e-6


def test_a_person_talks_and_hears_the_reply(gateway, stack, chromium, microphone, tmp_path):
    """Talk, say the sentence, Done talking: the gateway encodes the speech and answers it; first audio counts from
    the end of the speech. Then hands-free: the gateway finds the end of the sentence itself (no Done)."""
    if microphone is None:
        pytest.skip("espeak-ng is not installed (make tools installs it as root)")
    spoken_before = metric_value(scrape(gateway.metrics), "gateway_spoken_turns_total")
    speech_seconds = sf.info(microphone).duration

    async def scenario():
        page = await open_page(chromium, f"http://127.0.0.1:{gateway.http}/")
        try:
            await page.type("#key", KEY)
            await page.type("#max-tokens", "24")
            await page.js("document.getElementById('talk').click()")
            await page.until("mossPage.talking", 30, "the microphone did not open")
            assert await page.js("document.getElementById('talk').getAttribute('aria-pressed')") == "true"
            await asyncio.sleep(speech_seconds)  # the file, said in real time
            await page.key(" ", 32, ctrl=True)  # Ctrl+Space: done talking
            turn = await page.until("(() => { const t = mossPage.turns[0]; return t && t.summary && t; })()", 60,
                                    "the spoken turn was never answered")
            assert not await page.js("mossPage.errors.length"), await page.js("mossPage.errors")
            assert not await page.js("mossPage.talking")
            summary = turn["summary"]
            # the microphone sent about the file's length (less what played before capture began), and the gateway
            # encoded all of it
            sent = await page.js("mossPage.spokenSeconds")
            assert speech_seconds / 2 < sent < speech_seconds + 1, (sent, speech_seconds)
            assert abs(turn["spoken"] - sent) < 0.05 and abs(summary["user_audio_seconds"] - sent) < 0.05
            assert int(summary["user_codes"]) == turn["codes"] > 0
            played_gaplessly(turn)
            server_ms = summary["speech_end_to_first_audio_seconds"] * 1000
            assert server_ms <= turn["ttfa"] <= server_ms + 150, (turn["ttfa"], server_ms)
            assert "You: (spoken, " in await page.js("document.getElementById('log').textContent")
            print(f"\nscreenshot: {await page.screenshot(screenshot_dir(tmp_path) / 'web_page_spoken.png')}")

            # hands-free: the sentence and its silence make a turn with no press to end it
            await page.js("document.getElementById('hands-free').click()")
            await page.js("document.getElementById('talk').click()")
            turn = await page.until("(() => { const t = mossPage.turns[1]; return t && t.summary && t; })()", 60,
                                    "the hands-free turn was never answered")
            assert await page.js("mossPage.talking")  # still listening for the next utterance
            assert 0.5 < turn["spoken"] < speech_seconds, turn["spoken"]  # the sentence, found within the file
            played_gaplessly(turn)
            await page.key(" ", 32, ctrl=True)
            await page.until("!mossPage.talking", 10, "the microphone stayed open")
            assert not await page.js("mossPage.errors.length"), await page.js("mossPage.errors")
        finally:
            await page.close()

    asyncio.run(scenario())
    assert metric_value(scrape(gateway.metrics), "gateway_spoken_turns_total") == spoken_before + 2
    deadline = time.monotonic() + 20
    while any((held := left_held(gateway, stack)).values()):
        assert time.monotonic() < deadline, held
        time.sleep(0.05)


# seconds of silence before the voice that talks over the reply (after the question's own 0.9 s). At 0.6 s a slow run
# talked over the reply at its second chunk with 0.05 s queued ahead (2026-12-01); at 1.0 s 5-7 chunks had come, 3.4-6.6 s
# ahead, in three runs that day
BARGE_IN_WAIT = 1.0


@pytest.fixture(scope="module")
def interrupting_microphone(tmp_path_factory) -> Path | None:
    """The sentence, a pause in which the reply begins, then the sentence again over the reply (None without
    espeak-ng)."""
    try:
        first, rate = spoken(SPEECH, *SPEECH_SECONDS)
        again, _ = spoken(SPEECH, BARGE_IN_WAIT, SPEECH_SECONDS[1])
    except pytest.skip.Exception:
        return None
    path = tmp_path_factory.mktemp("microphone") / "interrupting.wav"
    sf.write(path, np.concatenate([first, again]), rate, subtype="PCM_16")
    return path


def test_a_voice_over_the_reply_stops_it_and_drops_its_audio_queued_ahead(gateway, stack, interrupting_microphone,
                                                                         tmp_path_factory, tmp_path):
    """Hands-free, the person asks, the reply plays, and the person talks over it: the page stops the reply's audio at
    once, the audio it had scheduled ahead of playback included, plays none of it that comes later, and the new
    utterance is answered; nothing is held afterwards."""
    if interrupting_microphone is None:
        pytest.skip("espeak-ng is not installed (make tools installs it as root)")

    async def scenario(port):
        page = await open_page(port, f"http://127.0.0.1:{gateway.http}/")
        try:
            await page.type("#key", KEY)
            await page.type("#max-tokens", "400")  # a reply longer than the pause: still playing when talked over
            await page.js("document.getElementById('hands-free').click()")
            await page.js("document.getElementById('talk').click()")
            try:
                barge = await page.until("mossPage.bargeIns[0]", 60, "the reply was never talked over")
            except AssertionError:  # what the page saw instead
                print(await page.js("JSON.stringify({turns: mossPage.turns.map(t => ({no: t.no, done: t.done, "
                                    "chunks: t.chunks.length, complete: !!t.summary})), errors: mossPage.errors})"))
                raise
            first = await page.js("mossPage.turns[0]")
            print(f"\nbarge-in: {barge}; the first reply: {len(first['chunks'])} chunks, "
                  f"{first['samples'] / max(first['rate'], 1):.2f} s, complete: {'summary' in first}")
            answer = await page.until("(() => { const t = mossPage.turns[1]; return t && t.summary && t; })()", 60,
                                      "the second utterance was never answered")
            await page.key(" ", 32, ctrl=True)
            await page.until("!mossPage.talking", 10, "the microphone stayed open")
            first_after = await page.js("mossPage.turns[0]")
            assert "you talked over it" in await page.js("document.getElementById('log').textContent")
            errors = await page.js("mossPage.errors")
            print(f"\nscreenshot: {await page.screenshot(screenshot_dir(tmp_path) / 'web_page_barge_in.png')}")
            return barge, first, first_after, answer, errors
        finally:
            await page.close()

    with launched_chromium(tmp_path_factory, interrupting_microphone) as port:
        barge, first, first_after, answer, errors = asyncio.run(scenario(port))
    assert not errors, errors
    assert barge["turn"] == first["no"] and barge["chunks"] > 0       # the first reply was playing
    assert barge["dropped"] > 0.1, barge                              # with audio queued ahead, dropped
    assert first_after["done"] and len(first_after["chunks"]) == barge["chunks"]  # it played nothing that came later
    assert all(c["arrived"] <= barge["at"] for c in first_after["chunks"])
    assert answer["no"] != first["no"] and answer["chunks"] and answer["summary"]["audio_seconds"] > 0
    deadline = time.monotonic() + 20
    while any((held := left_held(gateway, stack)).values()):
        assert time.monotonic() < deadline, held
        time.sleep(0.05)


def test_a_full_gateway_and_a_stage_down_are_said_plainly(stack, chromium, tmp_path):
    """The page's two other errors: a turn refused (the only place held by another client) says the service is busy
    and when to try again; a turn while the llm is down names the stage."""
    async def say(port: int, shot: str) -> str:
        page = await open_page(chromium, f"http://127.0.0.1:{port}/")
        try:
            await page.type("#text", "Hello?")
            await page.key("Enter", 13)
            await page.until("mossPage.errors.length > 0", 30, "no error shown")
            assert await page.js("document.getElementById('status').className") == "error"
            await page.screenshot(screenshot_dir(tmp_path) / shot)
            return await page.js("document.getElementById('status').textContent")
        finally:
            await page.close()

    with own_gateway(stack, tmp_path, "--max-turns", "1", "--max-queued-turns", "0", "--max-turns-per-client", "0",
                     "--client-stall-seconds", "10", http=True) as gw:
        with silent_speech_client(gw.http, "hold the only place"):
            deadline = time.monotonic() + 30
            while metric_value(scrape(gw.metrics), "gateway_active_requests") < 1:
                assert time.monotonic() < deadline, "the holding client was never admitted"
                time.sleep(0.05)
            shown = asyncio.run(say(gw.http, "web_page_busy.png"))
    assert shown.startswith("The service is busy: the turn was refused. Try again in "), shown

    down = tmp_path / "down"
    down.mkdir()
    with own_gateway(stack, down, "--llm-target", f"127.0.0.1:{free_port()}", "--ready-wait", "0.5", http=True,
                     serving=False) as gw:
        shown = asyncio.run(say(gw.http, "web_page_stage_down.png"))
    assert shown.startswith("A stage is down: ") and "llm" in shown, shown
