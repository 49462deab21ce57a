"""The encoder's speaker places in use during a level of `moss-serve bench --speech`, read from its Prometheus
/metrics (`encoder_speakers`, `encoder_speaker_places`): a speaking user holds one place from the first audio of a
speech to its end (hands-free: while the session listens), and a full encoder refuses the next speaker. Sampled every
SAMPLE_SECONDS on a thread of its own, so that the load's own event loop never waits on it."""

from __future__ import annotations

import re
import threading
import time
import urllib.request

SAMPLE_SECONDS = 0.1


def read(url: str, timeout: float = 1.0) -> tuple[float, float] | None:
    """→ (places in use, places in all) from the encoder's /metrics, or None if it cannot be read."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            text = r.read().decode()
    except (OSError, ValueError):
        return None
    values = {}
    for name in ("encoder_speakers", "encoder_speaker_places"):
        if m := re.search(rf"^{name} (\S+)$", text, re.MULTILINE):
            values[name] = float(m.group(1))
    if len(values) < 2:
        return None
    return values["encoder_speakers"], values["encoder_speaker_places"]


class PlacesSampler:
    """Samples the places in use from `start()` to `stop()` → `summary()`."""

    def __init__(self, url: str, every: float = SAMPLE_SECONDS):
        self.url, self.every = url, every
        self.samples: list[float] = []
        self.places = 0.0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="encoder-places", daemon=True)

    def start(self) -> PlacesSampler:
        self.thread.start()
        return self

    def stop(self) -> dict | None:
        self.stopping.set()
        self.thread.join(timeout=5)
        return self.summary()

    def summary(self) -> dict | None:
        """{"peak", "mean", "of"} places over the samples; None where none could be read."""
        if not self.samples:
            return None
        return {"peak": max(self.samples), "mean": sum(self.samples) / len(self.samples), "of": self.places,
                "samples": len(self.samples)}

    def _loop(self) -> None:
        while not self.stopping.is_set():
            began = time.monotonic()
            if (got := read(self.url)) is not None:
                self.samples.append(got[0])
                self.places = got[1]
            self.stopping.wait(max(0.0, self.every - (time.monotonic() - began)))
