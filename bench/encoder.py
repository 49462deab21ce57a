"""The speech encoder at the real size (random weights): speakers encoded as they talk, the way the service does it,
against encoding each turn once it has ended (the reference's way), on one GPU in one run.

    python bench/encoder.py --speakers 1,16,64 --seconds 8 --chunk-ms 100,500 --graphs on,off --json out.json

Each speaker's turn is `--seconds` of noise at 16 kHz, on the host as the service gets it. Streamed: every `--chunk-ms`
each speaker's next samples arrive, and one call encodes all of them (stream.feed_streams, the worker's call: the
features on the host, like chunks in one STFT, then the model with every speaker packed, its layers replayed from
CUDA graphs with `--graphs on`). At the end, every turn's end in one call (stream.finish_streams): the time from the
end of speech to the turn's codes is that last chunk's call plus the finish. Offline: the whole turn of every speaker
encoded after it ended (the model's `forward` on a batch of all speakers). Columns: x real time (seconds of audio
encoded per second of calls), a chunk's call (ms, median), end of speech → codes (ms), and the codes' agreement with
offline (in bf16 the packed and batched products round differently, so a code near a tie may flip).

Floor: the layers' multiply-adds for the frames (2 · params · frames) at the card's measured bf16 matrix rate.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path

import torch

from services.encoder import features
from services.encoder.checkpoint import random_tokenizer
from services.encoder.config import HOP, SAMPLE_RATE, glm4_voice, tiny
from services.encoder.kv_pool import KVPool
from services.encoder.stream import EncoderStream, feed_streams, finish_streams


def synced(fn):
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t


def matmul_rate(device: torch.device) -> float:
    if device.type != "cuda":
        return 1e12  # (a smoke run: no card to measure)
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    synced(lambda: [a @ a for _ in range(3)])  # (cuBLAS's first call sets it up)
    _, s = synced(lambda: [a @ a for _ in range(10)])
    return 10 * 2 * 8192 ** 3 / s


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--speakers", default="1,16,64")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--chunk-ms", default="100,500", help="chunk sizes, comma-separated")
    p.add_argument("--graphs", default="on,off", help="the layers from CUDA graphs: on, off, or both")
    p.add_argument("--json")
    p.add_argument("--device", default="cuda", help="cpu with --tiny: a smoke run of the script")
    p.add_argument("--tiny", action="store_true", help="the tiny config (CPU smoke run)")
    args = p.parse_args()
    device, cfg = torch.device(args.device), tiny() if args.tiny else glm4_voice()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = random_tokenizer(cfg).to(device, dtype)
    layer_params = sum(p.numel() for p in model.layers.parameters())
    rate = matmul_rate(device)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    out = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "gpu": gpu,
           "torch": torch.__version__, "bf16_matmul_tflops": rate / 1e12, "cells": {}}
    samples_total = int(args.seconds * SAMPLE_RATE) // features.CODE_SAMPLES * features.CODE_SAMPLES
    speakers = [int(x) for x in args.speakers.split(",")]
    pool = KVPool(cfg, max(speakers), device, dtype, scratch=device.type == "cuda")
    for graphs in args.graphs.split(","):
        model.graphs = None
        if graphs == "on" and device.type == "cuda":
            started = time.perf_counter()
            model.capture(pool, max(speakers))
            out["capture_s"] = time.perf_counter() - started
        for chunk_ms in (int(c) for c in args.chunk_ms.split(",")):
            chunk = chunk_ms * SAMPLE_RATE // 1000
            for n in speakers:
                cell = run_cell(model, pool, n, samples_total, chunk, layer_params, rate)
                cell |= {"graphs": graphs, "chunk_ms": chunk_ms}
                out["cells"][f"{graphs}/{chunk_ms}/{n}"] = cell
                print(f"graphs {graphs:3s}, {chunk_ms:3d} ms chunks, {n:3d} speakers: streamed "
                      f"{cell['stream_x_realtime']:7.0f}x RT, a call {cell['call_ms_median']:6.2f} ms, end of speech -> "
                      f"codes {cell['end_of_speech_to_codes_ms']:6.2f} ms; offline {cell['offline_x_realtime']:7.0f}x RT "
                      f"({cell['offline_ms']:.1f} ms); floor {cell['floor_ms']:.2f} ms; codes agree "
                      f"{100 * cell['agreement_with_offline']:.1f}%", flush=True)
    model.graphs = None
    print(f"\n{out['gpu']}, torch {out['torch']}, {out['date']}, {args.seconds} s turns")
    print(f"{'graphs':>6s} {'chunk ms':>8s} {'speakers':>8s} {'stream xRT':>10s} {'call ms':>8s} {'end->codes ms':>13s} "
          f"{'offline xRT':>11s} {'x floor':>8s} {'agree':>6s}")
    for c in out["cells"].values():
        print(f"{c['graphs']:>6s} {c['chunk_ms']:8d} {c['speakers']:8d} {c['stream_x_realtime']:10.0f} "
              f"{c['call_ms_median']:8.2f} {c['end_of_speech_to_codes_ms']:13.2f} {c['offline_x_realtime']:11.0f} "
              f"{c['stream_x_floor']:8.1f} {100 * c['agreement_with_offline']:5.1f}%")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


def run_cell(model, pool: KVPool, n: int, samples_total: int, chunk: int, layer_params: int, rate: float) -> dict:
    cfg = model.cfg
    g = torch.Generator().manual_seed(n)
    audio = [0.1 * torch.randn(samples_total, generator=g) for _ in range(n)]
    # offline: every turn after it ended, one batch
    mels = torch.stack([features.offline(a, cfg.num_mel_bins) for a in audio]).to(model.codebook.weight)
    model(mels)  # warm-up
    offline_codes, offline_s = synced(lambda: model(mels))
    # streamed, as the worker does it
    warm = EncoderStream(model, pool)
    feed_streams([(warm, audio[0][:chunk])])
    finish_streams([warm])
    streams = [EncoderStream(model, pool) for _ in range(n)]
    calls = []
    for at in range(0, samples_total, chunk):
        _, s = synced(lambda: feed_streams([(st, a[at : at + chunk]) for st, a in zip(streams, audio)]))
        calls.append(s)
    streamed, end_s = synced(lambda: finish_streams(streams))
    agree = float((torch.tensor(streamed, device=offline_codes.device) == offline_codes).float().mean())
    frames = n * samples_total // HOP // 2
    floor = 2 * layer_params * frames / rate
    audio_s = n * samples_total / SAMPLE_RATE
    return {"speakers": n, "audio_s": audio_s, "stream_calls": len(calls),
            "call_ms_median": statistics.median(calls) * 1e3,
            "stream_x_realtime": audio_s / (sum(calls) + end_s), "end_of_speech_to_codes_ms": (calls[-1] + end_s) * 1e3,
            "offline_ms": offline_s * 1e3, "offline_x_realtime": audio_s / offline_s, "floor_ms": floor * 1e3,
            "stream_x_floor": (sum(calls) + end_s) / floor, "agreement_with_offline": agree,
            "reencoded": sum(st.reencoded for st in streams)}


if __name__ == "__main__":
    main()
