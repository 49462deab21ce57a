"""The llm's share of the GPU, following the stack's load: the whole GPU while few turns run, a fixed part of its
multiprocessors (a green context) while the stack is busy.

Why: beside a busy vocoder the llm runs on a quarter of an H200's multiprocessors, or the vocoder's calls slow to
0.3 of their speed (its 6-stream call 37 → 112 ms beside the llm on the whole GPU, 69-72 ms beside it on a quarter:
docs/benchmarks.md, llm-share-2026-12-01). MPS fixes that share for the life of the process, so at one stream the
llm's decode step paid it too: 6.1-6.2 ms against 4.9 ms on the whole GPU, ~2/3 of the time to first audio being the
llm's. Here the llm process runs at MPS 100% and launches each step in one of two places:
- "whole": the process's own context and stream;
- "share": a green context of --busy-share percent of the multiprocessors, with its own stream and its own CUDA
  graphs (a graph runs where it was captured: services/common/green_context.py).

ShareRule decides, step by step: the whole GPU while at most `whole_gpu_turns` sequences have been running for the
last `quiet_seconds`, the share otherwise. The vocoder's work trails the llm's: it vocodes a stream's tokens within
the pacing lead (1.5 s on CUDA) of their sampling, so a window of 2 s after the last busy step covers the vocoder's
tail. A stream's first vocoder call runs while the llm holds its steps anyway (the first-audio hold: pacing.py).

Moving between places is free on the GPU (steps alternating every step averaged the two places' times) and costs the
host a context switch and a stream wait: the new stream waits for the old one's last work, so a step launched ahead
(engine.py) and tensors from the other stream are always ordered.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

WHOLE, SHARE = "whole", "share"
QUIET_SECONDS = 2.0  # the pacing lead on CUDA (1.5 s) and a margin: the vocoder's tail after the llm's last busy step


@dataclass
class ShareRule:
    """Where the next step runs, from how many sequences run now and ran lately (pure: no device)."""

    whole_gpu_turns: int
    quiet_seconds: float = QUIET_SECONDS
    busy_until: float = float("-inf")  # (monotonic seconds) the last busy step + quiet_seconds

    def place(self, running: int, now: float) -> str:
        if running > self.whole_gpu_turns:
            self.busy_until = now + self.quiet_seconds
            return SHARE
        return WHOLE if now >= self.busy_until else SHARE


class GpuShare:
    """The two places of a kernel runner's steps, and the switch between them (the engine's thread only: a green
    context is current on one thread at a time)."""

    def __init__(self, runner, busy_percent: int, whole_gpu_turns: int, device: torch.device):
        from services.common.green_context import GreenContext

        if not getattr(runner, "capturable", False):
            raise ValueError("--busy-share needs the kernel runner with CUDA graphs on CUDA")
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.green = GreenContext(max(1, round(sms * busy_percent / 100)), device)
        self.runner, self.rule = runner, ShareRule(whole_gpu_turns)
        self.whole_stream = torch.cuda.current_stream(device)
        with self.green.current():
            runner.capture(SHARE, stream=self.green.stream)
        runner.use(WHOLE)
        self.place, self.thread = WHOLE, threading.get_ident()
        self.steps = {WHOLE: 0, SHARE: 0}

    def select(self, running: int, now: float) -> str:
        """Before a step's first device work: move to the place the rule gives → that place."""
        place = self.rule.place(running, now)
        if threading.get_ident() != self.thread:  # a new stepping thread starts in the process's own context
            self.thread, self.place = threading.get_ident(), WHOLE
            self.runner.use(WHOLE)
        if place != self.place:
            if place == SHARE:
                self.green.stream.wait_stream(self.whole_stream)
                self.green.make_current()
            else:
                self.whole_stream.wait_stream(self.green.stream)
                self.green.release(self.whole_stream)
            self.runner.use(place)
            self.place = place
        self.steps[place] += 1
        return place

    def home(self) -> None:
        """Back to the whole GPU on this thread, the rule's memory cleared (after the warm-up's synthetic turns, on
        the thread that ran them: the engine's own thread steps from there)."""
        if self.place == SHARE:
            self.whole_stream.wait_stream(self.green.stream)
            self.green.release(self.whole_stream)
            self.runner.use(WHOLE)
            self.place = WHOLE
        self.rule.busy_until = float("-inf")

    def describe(self) -> str:
        return (f"its steps on the whole GPU while at most {self.rule.whole_gpu_turns} sequences ran in the last "
                f"{self.rule.quiet_seconds:g} s, else on {self.green.sm_count} of {self.green.device_sms} "
                f"multiprocessors (a green context)")


def share_of(runner, config, device: torch.device) -> GpuShare | None:
    """The engine's GpuShare where its config asks for one (busy_share), else None. Its graphs are captured here, before
    the engine's first step (they need the runner's step buffers still padding)."""
    if not config.busy_share:
        return None
    return GpuShare(runner, config.busy_share, config.whole_gpu_turns, device)
