"""Where the encoder's time goes when many speakers' turns end at once: each phase of stream.finish_streams
timed on its own (synchronised), then the same call under torch.profiler, its ops by host time.

    python bench/studies/encoder_profile.py --speakers 64 --seconds 8 --chunk-ms 100 --json out.json

Real size, random weights, bf16, the layers from CUDA graphs as the service runs them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch

from services.encoder import features
from services.encoder import stream as stream_module
from services.encoder.checkpoint import random_tokenizer
from services.encoder.config import SAMPLE_RATE, glm4_voice
from services.encoder.kv_pool import KVPool
from services.encoder.stream import EncoderStream, feed_streams, finish_streams


def talk(model, pool, n, samples, chunk, seed, silence=0) -> list[EncoderStream]:
    g = torch.Generator().manual_seed(seed)
    audio = [0.1 * torch.randn(samples, generator=g) for _ in range(n)]
    for a in audio:
        a[:silence] = 0.0  # digital silence first (as espeak-ng's WAVs start): every segment is encoded again
    streams = [EncoderStream(model, pool) for _ in range(n)]
    for at in range(0, samples, chunk):
        feed_streams([(s, a[at : at + chunk]) for s, a in zip(streams, audio)])
    torch.cuda.synchronize()
    return streams


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--speakers", type=int, default=64)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--chunk-ms", type=int, default=100)
    p.add_argument("--silence-ms", type=int, default=0, help="digital silence at each turn's start")
    p.add_argument("--json")
    args = p.parse_args()
    cfg = glm4_voice()
    model = random_tokenizer(cfg).to("cuda", torch.bfloat16)
    pool = KVPool(cfg, args.speakers, torch.device("cuda"), torch.bfloat16, scratch=True)
    model.capture(pool, args.speakers)
    samples = int(args.seconds * SAMPLE_RATE)
    chunk = args.chunk_ms * SAMPLE_RATE // 1000
    silence = args.silence_ms * SAMPLE_RATE // 1000
    finish_streams(talk(model, pool, args.speakers, samples, chunk, 0, silence))  # warm-up

    # the phases, one by one, as finish_streams runs them
    streams = talk(model, pool, args.speakers, samples, chunk, 1, silence)
    phases = {}

    def phase(name, fn):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        phases[name] = (time.perf_counter() - t) * 1e3
        return out

    mels = phase("features' ends (finish_many)", lambda: features.finish_many([s.features for s in streams]))
    phase("the last frames through the model", lambda: stream_module._encode(streams, mels))
    again = phase("last codes, floors, codes to the host (_close)", lambda: stream_module._close(streams, reopen=False))
    phase("segments encoded again", lambda: stream_module._reencode(again))
    for name, ms in phases.items():
        print(f"{name:50s} {ms:8.2f} ms")
    print(f"{'total':50s} {sum(phases.values()):8.2f} ms ({sum(a is not None for _, a in again)} encoded again)")

    streams = talk(model, pool, args.speakers, samples, chunk, 2, silence)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        finish_streams(streams)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=12)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "speakers": args.speakers,
                                               "phases_ms": phases, "profile": table}, indent=2))


if __name__ == "__main__":
    main()
