"""`moss-serve chat`: a typed spoken conversation in the terminal, through the gateway's Converse.

Each line typed is a turn: its reply's text is printed as it comes, its audio is written to
<out-dir>/turn_<n>.wav, then its timings. A line `@speech.wav` is a spoken turn: the file's audio is streamed to the
gateway as if spoken (the encoder works while it plays), then its end of speech. Ctrl-C while a reply streams
cancels it (barge-in: the model forgets that turn); a turn that fails (the gateway busy, a stage down) is said, and the session goes on;
Ctrl-D, or Ctrl-C at the prompt, ends the session.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import grpc
from moss.speech.v1 import common_pb2

from services.common.audio import decode_pcm, write_wav
from services.common.tls import ChannelTls
from services.gateway.client import converse


def run(args, tls: ChannelTls | None, sampling_fields: dict) -> int:
    """`moss-serve chat` with its parsed flags → exit status."""
    try:
        asyncio.run(chat(args.target, Path(args.out_dir), sampling=common_pb2.SamplingParams(**sampling_fields),
                         voice=args.voice, system_prompt=args.system_prompt, api_key=args.api_key, tls=tls))
    except grpc.aio.AioRpcError as err:
        print(f"moss-serve chat: {err.code().name}: {err.details()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except OSError as err:  # --out-dir not a directory that can be made, or a reply that cannot be written there
        print(f"moss-serve chat: cannot write in {args.out_dir}: {err.strerror or err}", file=sys.stderr)
        return 2
    return 0


async def chat(target: str, out_dir: Path, *, sampling: common_pb2.SamplingParams | None = None, voice: str = "",
               system_prompt: str = "", api_key: str | None = None, tls: ChannelTls | None = None,
               lines=sys.stdin, out=sys.stdout) -> None:
    loop = asyncio.get_running_loop()
    out_dir.mkdir(parents=True, exist_ok=True)
    async with converse(target, voice=voice, system_prompt=system_prompt, sampling=sampling, api_key=api_key,
                        tls=tls) as conv:
        print(f"session {conv.session_id}: type a line and Enter to speak; Ctrl-C cancels a reply; Ctrl-D ends",
              file=out, flush=True)
        turn = 0
        while True:
            print("> ", end="", file=out, flush=True)
            text = await loop.run_in_executor(None, lines.readline)
            if not text:
                print(file=out)
                break
            if not text.strip():
                continue
            turn += 1
            if text.strip().startswith("@"):
                try:
                    await _send_speech(conv, text.strip()[1:])
                except (OSError, RuntimeError) as err:  # (soundfile's errors for a file it cannot read)
                    print(f"[cannot read {text.strip()[1:]!r}: {err}]", file=out, flush=True)
                    turn -= 1
                    continue
            else:
                await conv.send(text.strip())
            cancel = lambda: asyncio.ensure_future(conv.cancel())  # noqa: E731
            interactive = lines is sys.stdin and sys.stdin.isatty()
            if interactive:
                loop.add_signal_handler(signal.SIGINT, cancel)
            try:
                await _reply(conv, turn, out_dir, out)
            finally:
                if interactive:
                    loop.remove_signal_handler(signal.SIGINT)
        ended = await conv.close()
    print(f"session ended ({common_reason(ended)})", file=out, flush=True)


async def _send_speech(conv, path: str) -> None:
    """A spoken turn from a WAV (or any file soundfile reads; channels mixed down), streamed at its own pace."""
    import soundfile as sf
    from moss.speech.v1 import gateway_pb2

    samples, rate = sf.read(path, dtype="float32", always_2d=True)
    await conv.call.write(gateway_pb2.ConverseRequest(speech=gateway_pb2.SpeechInput(sample_rate=rate)))
    pcm = (samples.mean(axis=1).clip(-1, 1) * 32767).astype("<i2")
    step = rate // 10
    for i in range(0, len(pcm), step):
        await conv.call.write(gateway_pb2.ConverseRequest(audio=gateway_pb2.UserAudio(pcm=pcm[i : i + step].tobytes())))
        await asyncio.sleep(step / rate)
    await conv.call.write(gateway_pb2.ConverseRequest(end_of_speech=gateway_pb2.EndOfSpeech()))
    conv.turns_sent += 1


async def _reply(conv, turn: int, out_dir: Path, out) -> None:
    pcm, rate, fmt = [], 0, common_pb2.AUDIO_FORMAT_PCM16
    async for msg in conv.replies():
        kind = msg.WhichOneof("kind")
        if kind == "metadata":
            rate, fmt = msg.metadata.sample_rate, msg.metadata.format
        elif kind == "audio":
            pcm.append(msg.audio.pcm)
        elif kind == "text":
            print(msg.text.text, end="", file=out, flush=True)
        elif kind == "speech_ended":
            print(f"[heard {msg.speech_ended.audio_seconds:.2f} s of speech: {msg.speech_ended.codes} codes] ", end="",
                  file=out, flush=True)
        elif kind == "cancelled":
            print(f"\n[turn {turn} cancelled in {msg.cancelled.seconds * 1e3:.0f} ms]", file=out, flush=True)
        elif kind == "failed":  # the session goes on: the line may be typed again
            hint = f"; try again in {msg.failed.retry_after_seconds:.1f} s" if msg.failed.retry_after_seconds else ""
            print(f"\n[turn {turn} failed: {msg.failed.code}: {msg.failed.message}{hint}]", file=out, flush=True)
        elif kind == "summary":
            s = msg.summary
            path = out_dir / f"turn_{turn}.wav"
            write_wav(str(path), decode_pcm(b"".join(pcm), fmt), rate)
            print(f"\n[turn {turn}: {path}, {s.audio_seconds:.2f} s of audio; first audio after "
                  f"{s.ttfa_seconds * 1e3:.0f} ms, {s.prompt_tokens} prompt tokens]", file=out, flush=True)


def common_reason(ended) -> str:
    from moss.speech.v1 import gateway_pb2

    return "no reason given" if ended is None else gateway_pb2.SessionEndReason.Name(ended.reason).removeprefix(
        "SESSION_END_REASON_").lower()
