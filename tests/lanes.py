"""Streams through the vocoder's two worker lanes (worker.Lanes), as the servicer drives them: round by round, each
stream's next piece of tokens (then its end), a stream's first chunk to the first-chunk lane and the rest, once it
plays, to the other."""

from __future__ import annotations

import time

import numpy as np

from services.vocoder.streamer import MelStreamer
from services.vocoder.worker import Job


def run_streams(lanes, vocoder, inputs: list[tuple[list[int], list[int]]], pause: float = 0.0) -> list[np.ndarray]:
    """inputs: (tokens, schedule: the pieces' sizes) per stream → each stream's samples. pause: seconds between
    rounds."""
    streams = [MelStreamer(vocoder) for _ in inputs]
    outs, at, started = [[] for _ in inputs], [0] * len(inputs), [None] * len(inputs)
    for r in range(max(len(schedule) for _, schedule in inputs) + 1):
        futures = []
        for i, ((tokens, schedule), s) in enumerate(zip(inputs, streams)):
            if r < len(schedule):
                job = Job(s, tokens[at[i] : at[i] + schedule[r]], started[i], 0.0)
                at[i] += schedule[r]
            elif r == len(schedule):
                job = Job(s, None, started[i], 0.0)
            else:
                continue
            futures.append((i, lanes.submit(job)))
        for i, future in futures:
            samples = future.result(timeout=60).samples
            outs[i].append(samples)
            if len(samples) and started[i] is None:
                started[i] = 1.0  # the stream plays: its next chunks go to the other lane
        time.sleep(pause)
    return [np.concatenate(o) for o in outs]
