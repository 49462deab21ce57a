"""Streamed vs offline agreement of the codec decoder (flow + HiFT), for every chunk schedule the gateway uses.

    python bench/codec_seams.py --preset moss-speech --device cuda --json out.json

Offline: the whole stream's tokens decoded by the flow at once (streaming mode: block-causal attention, the
stream's end without look-ahead), then HiFT over the whole mel. Streamed: the vocoder's path (MelStreamer over
the flow's blocks and HiFT's windows), chunk by chunk. SNR in dB of the streamed mel and waveform against the
offline ones, with the flow's context bounded (the default 40 tokens) and whole (every token: the blocks are
then the offline decode), at the default HiFT look-ahead (4 frames) and at its receptive field.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from services.vocoder.loader import FlowOptions, load_vocoder
from services.vocoder.streamer import DEFAULT_LOOKAHEAD, MelStreamer

# The gateway's chunk schedules (common.proto ChunkPolicy): the default (8, 8, 16, 20, ...), the earlier default
# (4, 4, 8, 16, 20, ...), the smallest (one token a chunk), and one flow block a chunk.
SCHEDULES = {"default 8,8,16,20": [8, 8, 16] + [20] * 50, "4,4,8,16,20": [4, 4, 8, 16] + [20] * 50,
             "1 token": [1] * 1000, "5 tokens": [5] * 200}


def snr(x: np.ndarray, ref: np.ndarray) -> float:
    return float(10 * np.log10((ref ** 2).sum() / max(((x - ref) ** 2).sum(), 1e-30)))


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny-codec", choices=["tiny-codec", "moss-speech"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--tokens", type=int, default=100, help="a stream's length (100: 8 s)")
    p.add_argument("--json")
    args = p.parse_args()
    rows = []
    for context in (40, 10_000):
        v = load_vocoder(None, args.preset, args.device, flow=FlowOptions(max_context_tokens=context))
        tokens = np.random.default_rng(0).integers(0, v.codebook_size, args.tokens).tolist()
        mel = v.mel(tokens)
        wav = v.waveform(mel)
        left, right = v.receptive_field
        for name, schedule in SCHEDULES.items():
            for lookahead in (DEFAULT_LOOKAHEAD, right):
                s, pieces, mels, at = MelStreamer(v, left_context=left, lookahead=lookahead), [], [], 0
                for n in schedule:
                    if at >= len(tokens):
                        break
                    pieces.append(s.push(tokens[at : at + n]))
                    at += n
                pieces.append(s.flush())
                state, at = v.start(), 0
                for n in schedule:
                    if at >= len(tokens):
                        break
                    m, state = v.mel_chunks([(tokens[at : at + n], state)])[0]
                    mels.append(m)
                    at += n
                mels.append(v.mel_chunks([(None, state)])[0][0])
                row = {"context_tokens": context if context < 10_000 else "all", "schedule": name, "lookahead": lookahead,
                       "mel_snr_db": snr(torch.cat(mels, 1).float().cpu().numpy(), mel.float().cpu().numpy()),
                       "wav_snr_db": snr(np.concatenate(pieces), wav)}
                rows.append(row)
                print(f"context {row['context_tokens']!s:>4}  {name:20s} lookahead {lookahead:2d}: mel {row['mel_snr_db']:6.1f} dB, "
                      f"waveform {row['wav_snr_db']:6.1f} dB", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": args.preset, "device": args.device, "tokens": args.tokens, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
