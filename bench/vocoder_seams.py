"""Streamed against offline synthesis: SNR of the streamed waveform for several chunk schedules and contexts.

    python bench/vocoder_seams.py --json out.json              # CPU, float32, a minute or two

The vocoder as the service runs it (token decoder with its per-stream state, MelStreamer windows, the runner's
bucket padding) against offline synthesis of the same tokens in one call. Random weights at the 24 kHz / hop-480
layout, 64 channels (same kernels, strides and dilations as the real width: the same receptive field). Rows:
left context and lookahead in mel frames; columns: chunks of 1, 2 and 5 tokens. Trained weights are to be
measured (none are available here).
"""

from __future__ import annotations

import argparse
import datetime
import json

import numpy as np
import torch

from services.vocoder import generator as gen
from services.vocoder.loader import _random_decoder_for
from services.vocoder.streamer import DEFAULT_LOOKAHEAD, MelStreamer
from services.vocoder.vocoder import TokenVocoder


def snr_db(reference: np.ndarray, x: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference**2) / max(np.sum((reference - x) ** 2), 1e-30)))


def streamed(vocoder, tokens, chunk: int, left: int, lookahead: int) -> np.ndarray:
    streamer = MelStreamer(vocoder, left, lookahead)
    pieces = [streamer.push(tokens[i : i + chunk]) for i in range(0, len(tokens), chunk)]
    return np.concatenate(pieces + [streamer.flush()])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--tokens", type=int, default=30)
    p.add_argument("--chunks", default="1,2,5")
    p.add_argument("--json")
    args = p.parse_args()
    h = gen.preset_config("moss-speech")
    h["upsample_initial_channel"] = args.channels
    vocoder = TokenVocoder(_random_decoder_for(h, 16384, 64, 0), gen.build_generator(h, seed=0), torch.device("cpu"))
    left, right = vocoder.receptive_field
    tokens = np.random.default_rng(1).integers(0, vocoder.codebook_size, args.tokens).tolist()
    offline = vocoder.waveform(vocoder.mel(tokens))
    chunks = [int(c) for c in args.chunks.split(",")]
    contexts = [(left, DEFAULT_LOOKAHEAD), (left, 6), (left, 8), (left, right), (16, DEFAULT_LOOKAHEAD), (0, 0)]
    rows = []
    print(f"receptive field: {left} frames left, {right} right; {args.tokens} tokens; default context "
          f"({left}, {DEFAULT_LOOKAHEAD})")
    print(f"{'left, lookahead':>16s} " + " ".join(f"{f'{c}-token':>10s}" for c in chunks))
    for lc, la in contexts:
        snrs = {c: snr_db(offline, streamed(vocoder, tokens, c, lc, la)) for c in chunks}
        rows.append({"left_context": lc, "lookahead": la, "snr_db": snrs})
        print(f"{f'{lc}, {la}':>16s} " + " ".join(f"{snrs[c]:8.1f}dB" for c in chunks), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": datetime.datetime.now().isoformat(timespec="seconds"), "channels": args.channels,
                       "tokens": args.tokens, "receptive_field": [left, right], "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
