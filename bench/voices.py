"""Making a voice through the API beside streams playing: how long Gateway.CreateVoice takes, and whether the
streams stay stall-free, side by side in one run on one stack.

    alone    CreateVoice with nothing playing: the floor of making a voice (the encoder's codes, each vocoder's mel,
             x-vector and prompt prefix)
    streams  --streams replies played through, no voice made: what the streams do without it (after one such run
             unrecorded, as the gateway's admission learns the stack's pace)
    beside   the same replies, and CreateVoice --after seconds into them

A stack of its own (`moss-serve up` with --up-args, a voices directory of its own and the speaker model), or a
running one's gateway (--gateway: its vocoders need --speaker-model and a writable --voices-dir). The recording is
espeak-ng's speech unless --recording names one; the speaker model a stand-in with CAM++'s interface (the `onnx`
package makes it) unless --speaker-model names one. Each voice is deleted once timed.

    python bench/voices.py --streams 4 --json voices.json                              # a tiny CPU stack
    python bench/voices.py --up-args "--device cuda --preset moss-speech" --streams 64 --json voices.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc  # noqa: E402

from services.bench.load import LoadSpec, run_load  # noqa: E402
from services.bench.report import summarize  # noqa: E402
from services.stack import is_serving  # noqa: E402

TEXT = "Tell me a long story about the sea, the wind and the ships that sail on it."
SENTENCE = "This is how I sound when I speak, slowly and clearly, for a voice of my own."
GATEWAY = "127.0.0.1:50051"


def recording(path: str | None) -> tuple[np.ndarray, int]:
    """The speaker's recording: the file given, or espeak-ng's sentence."""
    from services.common.audio import read_audio

    if path:
        return read_audio(path)
    if shutil.which("espeak-ng") is None:
        sys.exit("bench/voices.py: no --recording and no espeak-ng to make one")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["espeak-ng", "-w", f"{tmp}/s.wav", SENTENCE], check=True, capture_output=True)
        return read_audio(f"{tmp}/s.wav")


def stand_in_speaker_model(path: Path) -> Path:
    """An ONNX model with CAM++'s interface, random weights as the rest (voice_maker's stand-in)."""
    from services.voice_maker import stand_in_speaker_model as write

    try:
        write(path)
    except ImportError:
        sys.exit("bench/voices.py: give --speaker-model (campplus.onnx), or install onnx for a stand-in")
    return path


@contextlib.contextmanager
def own_stack(up_args: list[str], speaker_model: str, work: Path):
    """`moss-serve up` with a voices directory holding a random default voice of its preset → the gateway's target."""
    from services.vocoder.codec import config as codec_config
    from services.vocoder.codec.voice import random_voice, save_voice

    preset = up_args[up_args.index("--preset") + 1] if "--preset" in up_args else "tiny"
    cfg = codec_config.moss_speech() if preset == "moss-speech" else codec_config.tiny()
    save_voice(random_voice(cfg.flow, prompt_tokens=40 if preset == "moss-speech" else 10), work / "voices")
    log = open(work / "up.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "up", *up_args, "--voices-dir", str(work / "voices"),
                             "--speaker-model", speaker_model], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 900
        while not is_serving(GATEWAY):
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"bench/voices.py: the stack did not start (see {work / 'up.log'})")
            time.sleep(1)
        yield GATEWAY
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


async def create_voice(stub, name: str, samples: np.ndarray, rate: int, key: str | None) -> dict:
    """CreateVoice, timed from its first message to its answer; the voice deleted after."""
    pcm = (np.clip(np.round(samples * 32768), -32768, 32767)).astype("<i2").tobytes()
    messages = [gateway_pb2.CreateVoiceRequest(config=gateway_pb2.VoiceConfig(
        name=name, sample_rate=rate, format=common_pb2.AUDIO_FORMAT_PCM16))]
    messages += [gateway_pb2.CreateVoiceRequest(audio=pcm[i : i + 65536]) for i in range(0, len(pcm), 65536)]
    metadata = (("authorization", f"Bearer {key}"),) if key else ()
    began = time.perf_counter()
    try:
        info = await stub.CreateVoice(iter(messages), metadata=metadata, timeout=300)
    except grpc.aio.AioRpcError as err:
        return {"seconds": time.perf_counter() - began, "error": f"{err.code().name}: {err.details()}"}
    seconds = time.perf_counter() - began
    await stub.DeleteVoice(gateway_pb2.DeleteVoiceRequest(name=name), metadata=metadata, timeout=60)
    return {"seconds": seconds, "fast": info.fast, "prompt_seconds": info.prompt_seconds}


async def measure(target: str, args, samples: np.ndarray, rate: int) -> dict:
    channel = grpc.aio.insecure_channel(target)
    stub = gateway_pb2_grpc.GatewayStub(channel)
    spec = LoadSpec(target=target, prompts=[TEXT], requests=args.streams, concurrency=args.streams,
                    max_new_tokens=args.tokens, min_new_tokens=args.tokens, progress=False, api_key=args.api_key)
    alone = [await create_voice(stub, f"bench-alone-{i}", samples, rate, args.api_key) for i in range(args.trials)]
    results = {"alone": {"voices": alone}}
    await run_load(spec, "warm-up")  # (admission by headroom learns the stack's pace: the runs after compare alike)
    records, wall = await run_load(spec, "streams")
    results["streams"] = {"summary": summarize(records, wall)}
    beside = []
    for i in range(args.trials):
        async def later(i=i):
            await asyncio.sleep(args.after)
            return await create_voice(stub, f"bench-beside-{i}", samples, rate, args.api_key)

        (records, wall), voice = await asyncio.gather(run_load(spec, "beside"), later())
        beside.append({"voice": voice, "summary": summarize(records, wall)})
    results["beside"] = beside
    await channel.close()
    return results


def table(results: dict, streams: int) -> str:
    def voice_cell(voices: list[dict]) -> str:
        done = [v["seconds"] for v in voices if "error" not in v]
        errors = [v["error"] for v in voices if "error" in v]
        slow = sum(1 for v in voices if "error" not in v and not v["fast"])
        cell = f"{np.median(done):.2f} s (max {max(done):.2f})" if done else "-"
        cell += f", {slow} not on the fast path" if slow else ""
        return cell + (f"; {len(errors)} failed: {errors[0]}" if errors else "")

    def streams_cell(summary: dict) -> str:
        refused = f", {summary['requests'] - summary['ok']} refused" if summary["requests"] > summary["ok"] else ""
        return (f"{summary['stall_free_streams']}/{summary['ok']} stall-free{refused}, {summary['stalls']} stalls "
                f"({summary['stall_seconds']['total']:.2f} s), TTFA p95 {summary['ttfa_seconds']['p95'] * 1000:.0f} ms")

    rows = [("alone", "0", voice_cell(results["alone"]["voices"]), "-"),
            ("streams", str(streams), "-", streams_cell(results["streams"]["summary"]))]
    for i, b in enumerate(results["beside"]):
        rows.append((f"beside #{i + 1}", str(streams), voice_cell([b["voice"]]), streams_cell(b["summary"])))
    head = ("run", "streams", "CreateVoice", "the streams")
    width = [max(len(r[c]) for r in [head, *rows]) for c in range(4)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, width)) for r in [head, *rows])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gateway", help="a running stack's gateway (default: start one)")
    p.add_argument("--up-args", default="", help="flags for `moss-serve up` (its own stack)")
    p.add_argument("--streams", type=int, default=4, help="replies playing while the voice is made")
    p.add_argument("--tokens", type=int, default=100, help="each reply's tokens (80 ms each)")
    p.add_argument("--after", type=float, default=2.0, help="seconds into the replies that CreateVoice is sent")
    p.add_argument("--trials", type=int, default=3, help="voices made alone, and runs beside the streams")
    p.add_argument("--recording", help="the speaker's recording (default: espeak-ng's sentence)")
    p.add_argument("--speaker-model", help="CAM++ in ONNX (default: a stand-in, random weights)")
    p.add_argument("--api-key")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    samples, rate = recording(args.recording)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.gateway:
            target, stack = args.gateway, contextlib.nullcontext(args.gateway)
        else:
            model = args.speaker_model or str(stand_in_speaker_model(work / "speaker.onnx"))
            stack = own_stack(shlex.split(args.up_args), model, work)
        with stack as target:
            results = asyncio.run(measure(target, args, samples, rate))
    print(f"making a voice ({len(samples) / rate:.1f} s recording) beside {args.streams} streams of "
          f"{args.tokens * 0.08:.1f} s, CreateVoice {args.after:g} s into them")
    print(table(results, args.streams))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv), "host": os.uname().nodename,
            "recording_seconds": len(samples) / rate, **vars(args), "results": results}, indent=1, default=float))


if __name__ == "__main__":
    main()
