"""Does the vocoder make NaN or inf? Its service alone, streams of random codes, once per set of flags.

Every real-size stack on an H100 since 2026-11-27 logged numpy's "invalid value encountered in cast" from the
vocoder's PCM encoding: a NaN sample (docs/benchmarks.md, 2026-11-28). The real-size codec on a CPU gave none, so it
comes from a GPU path. The vocoder now counts such windows by where they first show (vocoder_nonfinite_windows_total:
the token decoder's mel, or only the generator's samples) and sends them as silence. This starts the vocoder with
each --variant's flags in turn, plays --streams streams of random codes through it (--concurrency at once, replies of
--reply seconds, chunks of 4 tokens, then 8, 16 and 20 as the gateway sends them, FLOAT32 samples), and prints,
per variant, the windows counted at each stage, the samples sent as silence, and any non-finite sample the client
still got (there should be none). With --alone N it then plays the first N streams again one at a time and compares:
the same codes give the same samples to float error however they are batched, so a stream whose 0.1 s windows
disagree somewhere has had its audio go wrong under load, NaN or not. Writes --json.

  python3 bench/studies/vocoder_finite.py --device cuda --preset moss-speech --alone 20 --variant as-up="--first-chunk-lane on" \\
      --variant no-lane= --variant no-history="--first-chunk-lane on --flow-history-streams 0"

(`moss-serve up` runs the vocoder with `--first-chunk-lane on` on a GPU; a bare vocoder has it off.) Without MPS and
the llm beside it: a NaN that needs their company will not show here.
  python3 bench/studies/vocoder_finite.py --device cpu --preset tiny-codec --streams 4   # the plumbing
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "protos")]

import grpc  # noqa: E402
from moss.speech.v1 import common_pb2, vocoder_pb2, vocoder_pb2_grpc  # noqa: E402

from services.stack import free_port, is_serving  # noqa: E402

CHUNKS = (4, 8, 16)  # the first chunks' tokens; then 20 a chunk
LATER_CHUNK = 20
TOKENS_PER_SECOND = 12.5


def metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name + labels)} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


async def stream(stub, codes: list[int], pace: float, keep: bool) -> dict:
    """One Vocode call: the codes in the gateway's chunk sizes, `pace` seconds apart → its samples (keep: all of them)."""

    async def requests():
        yield vocoder_pb2.VocodeRequest(config=vocoder_pb2.VocodeConfig(format=common_pb2.AUDIO_FORMAT_FLOAT32))
        at, k = 0, 0
        while at < len(codes):
            size = CHUNKS[k] if k < len(CHUNKS) else LATER_CHUNK
            yield vocoder_pb2.VocodeRequest(tokens=vocoder_pb2.AudioTokens(tokens=codes[at : at + size]))
            at, k = at + size, k + 1
            await asyncio.sleep(pace)
        yield vocoder_pb2.VocodeRequest(end=vocoder_pb2.EndOfTokens())

    parts, samples, nonfinite = [], 0, 0
    async for reply in stub.Vocode(requests(), timeout=600):
        x = np.frombuffer(reply.pcm, "<f4")
        samples += len(x)
        nonfinite += int(np.count_nonzero(~np.isfinite(x)))
        if keep:
            parts.append(x)
    return dict(tokens=len(codes), samples=samples, nonfinite=nonfinite,
                audio=np.concatenate(parts) if keep and parts else None)


async def play(target: str, streams: list[list[int]], concurrency: int, pace: float, keep: int) -> list[dict]:
    """Every stream's codes through the vocoder, `concurrency` at once; the first `keep` streams' samples kept."""
    gate = asyncio.Semaphore(concurrency)
    async with grpc.aio.insecure_channel(target) as channel:
        stub = vocoder_pb2_grpc.VocoderStub(channel)

        async def one(i: int) -> dict:
            async with gate:
                return await stream(stub, streams[i], pace, i < keep)
        return await asyncio.gather(*(one(i) for i in range(len(streams))))


def agreement(loaded: np.ndarray, alone: np.ndarray, rate: int) -> tuple[float, float]:
    """A stream's samples under load against the same codes vocoded alone → (SNR over the stream, the worst SNR of
    its 0.1 s windows), dB. The same codes give the same samples to float error however they are batched (the flow's
    noise is a fixed table, HiFT's seeded by sample position), so a low window is a stream's audio gone wrong there."""
    n = min(len(loaded), len(alone))
    a, b = alone[:n].astype(np.float64), loaded[:n].astype(np.float64)
    if len(loaded) != len(alone) or n == 0:
        return -math.inf, -math.inf

    def snr(x, y):
        noise = float(np.sum((x - y) ** 2))
        return math.inf if noise == 0 else 10 * math.log10(max(float(np.sum(x**2)), 1e-30) / noise)
    w = max(1, rate // 10)
    windows = [snr(a[i : i + w], b[i : i + w]) for i in range(0, n, w)]
    return snr(a, b), min(windows)


def codebook_size(preset: str) -> int:
    from services.vocoder.codec.config import PRESETS
    return PRESETS["tiny" if preset == "tiny-codec" else preset]().flow.vocab_size


def run_variant(name: str, flags: list[str], args, log_dir: Path) -> dict:
    port, metrics_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "services.cli", "vocoder", "--host", "127.0.0.1", "--port", str(port),
           "--metrics-port", str(metrics_port), "--preset", args.preset, "--device", args.device, *flags]
    log_path = log_dir / f"vocoder_{name}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[2], stdout=log, stderr=subprocess.STDOUT)
    try:
        target, started = f"127.0.0.1:{port}", time.monotonic()
        while not is_serving(target):
            if proc.poll() is not None:
                raise SystemExit(f"vocoder ({name}) exited {proc.returncode}: see {log_path}")
            if time.monotonic() - started > args.start_timeout:
                raise SystemExit(f"vocoder ({name}) not serving after {args.start_timeout} s: see {log_path}")
            time.sleep(0.5)
        rng = np.random.default_rng(args.seed)
        codebook = codebook_size(args.preset)
        streams = [rng.integers(0, codebook, max(1, round(rng.uniform(*args.reply) * TOKENS_PER_SECOND))).tolist()
                   for _ in range(args.streams)]
        t = time.monotonic()
        results = asyncio.run(play(target, streams, args.concurrency, args.pace, args.alone))
        seconds = time.monotonic() - t
        alone = asyncio.run(play(target, streams[: args.alone], 1, args.pace, args.alone)) if args.alone else []
        agree = [agreement(r["audio"], a["audio"], args.sample_rate) for r, a in zip(results, alone)]
        text = scrape(metrics_port)
        if "vocoder_nonfinite_windows_total" not in text:
            raise SystemExit(f"vocoder ({name}) exports no vocoder_nonfinite_windows_total: an older tree?")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    warnings = [line.strip() for line in open(log_path) if "NaN or inf" in line]
    return dict(variant=name, flags=flags, streams=len(results), seconds=round(seconds, 1),
                audio_seconds=round(sum(r["samples"] for r in results) / args.sample_rate, 1),
                windows_mel=metric(text, "vocoder_nonfinite_windows_total", '{stage="mel"}'),
                windows_generator=metric(text, "vocoder_nonfinite_windows_total", '{stage="generator"}'),
                samples_silenced=metric(text, "vocoder_nonfinite_samples_total"),
                streams_with_nonfinite_at_client=sum(1 for r in results if r["nonfinite"]),
                alone_checked=len(agree),
                snr_db_min=min((a[0] for a in agree), default=None),
                window_snr_db_min=min((a[1] for a in agree), default=None),
                window_snr_db=[round(a[1], 1) for a in agree],
                log_warnings=warnings[:5])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--preset", default="moss-speech", choices=("moss-speech", "tiny-codec"))
    p.add_argument("--variant", action="append", default=[],
                   help='NAME=FLAGS: vocoder flags of one run (default: "defaults=")')
    p.add_argument("--streams", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=48)
    p.add_argument("--reply", default="2-20", help="seconds of audio a stream, uniform in LOW-HIGH")
    p.add_argument("--pace", type=float, default=0.1, help="seconds between a stream's chunks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--alone", type=int, default=0,
                   help="then vocode the first N streams again one at a time, and compare (SNR, dB: agreement())")
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--sample-rate", type=int, default=24000)
    p.add_argument("--log-dir", default=".", help="where each vocoder's log goes")
    p.add_argument("--json")
    args = p.parse_args()
    low, _, high = args.reply.partition("-")
    args.reply = (float(low), float(high or low))
    variants = [v.partition("=") for v in (args.variant or ["defaults="])]
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, _, flags in variants:
        rows.append(run_variant(name, shlex.split(flags), args, log_dir))
        r = rows[-1]
        print(f"{r['variant']}: {r['streams']} streams, {r['audio_seconds']} s of audio in {r['seconds']} s; non-finite "
              f"windows: mel {r['windows_mel']:.0f}, generator {r['windows_generator']:.0f}", flush=True)
    print(f"\n{'variant':<16} {'streams':>7} {'audio s':>8} {'mel':>5} {'generator':>9} {'silenced':>9} {'at client':>9}"
          f" {'alone':>5} {'SNR min':>8} {'0.1 s min':>9}")
    for r in rows:
        db = [("-" if v is None else f"{v:.1f}") for v in (r["snr_db_min"], r["window_snr_db_min"])]
        print(f"{r['variant']:<16} {r['streams']:>7} {r['audio_seconds']:>8} {r['windows_mel']:>5.0f} "
              f"{r['windows_generator']:>9.0f} {r['samples_silenced']:>9.0f} {r['streams_with_nonfinite_at_client']:>9}"
              f" {r['alone_checked']:>5} {db[0]:>8} {db[1]:>9}")
    for r in rows:
        for line in r["log_warnings"]:
            print(f"  {r['variant']}: {line}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(date=datetime.date.today().isoformat(), device=args.device,
                                                   preset=args.preset, argv=sys.argv[1:], rows=rows), indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
