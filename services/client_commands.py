"""The client commands of `moss-serve`: say, chat and bench, which call a running gateway (cli.py parses the rest)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from services.settings import GRPC_PORTS, METRICS_PORTS, concurrencies, count, positive, rates, seconds, span

GATEWAY_TARGET = f"localhost:{GRPC_PORTS['gateway']}"  # where the client commands (say, chat, bench) call by default


def _client_tls_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls-ca", help="PEM CA: reach the gateway over TLS, checking its certificate")
    p.add_argument("--tls-cert", help="PEM certificate to present, where the gateway requires one (mutual TLS)")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")


def _client_tls(args, command: str):
    """→ (ChannelTls or None, error message or None) from a client's --tls-* flags."""
    from services.common.tls import channel_tls

    try:
        return channel_tls(args.tls_ca, args.tls_cert, args.tls_key, flag="--tls"), None
    except ValueError as e:
        return None, f"moss-serve {command}: {e}"


def add_say(sub) -> None:
    say = sub.add_parser("say", help="one turn through the gateway (text, or speech from a WAV), its reply into a WAV file")
    say.add_argument("text", nargs="?", help="the user's words (or --audio)")
    say.add_argument("--audio", metavar="WAV", help="a spoken turn: the file's audio, streamed as if spoken, then its end")
    say.add_argument("--reply", choices=["speech", "text"], default="speech", help="the reply's modality (default speech)")
    say.add_argument("-o", "--output", default="out.wav")
    say.add_argument("--target", default=GATEWAY_TARGET)
    say.add_argument("--voice", default="")
    say.add_argument("--temperature", type=float)
    say.add_argument("--max-new-tokens", type=int)
    say.add_argument("--seed", type=int)
    say.add_argument("--timeout", type=float, default=120.0)
    say.add_argument("--api-key", default=os.environ.get("MOSS_API_KEY"), help="sent as 'authorization: Bearer <key>' "
                                                                             "(default: $MOSS_API_KEY)")
    _client_tls_options(say)


def add_chat(sub) -> None:
    chat = sub.add_parser("chat", help="a typed spoken conversation through the gateway (Converse); each reply "
                                       "to a WAV file")
    chat.add_argument("--target", default=GATEWAY_TARGET)
    chat.add_argument("--out-dir", default="chat", help="where turn_<n>.wav go (default ./chat)")
    chat.add_argument("--voice", default="")
    chat.add_argument("--system-prompt", default="", help="replaces the voice's system prompt")
    chat.add_argument("--temperature", type=float)
    chat.add_argument("--max-new-tokens", type=int)
    chat.add_argument("--seed", type=int)
    chat.add_argument("--api-key", default=os.environ.get("MOSS_API_KEY"), help="sent as 'authorization: Bearer <key>' "
                                                                              "(default: $MOSS_API_KEY)")
    _client_tls_options(chat)


def add_bench(sub) -> None:
    bench = sub.add_parser("bench", help="load the gateway and measure TTFA, RTF and stalls at the client",
                           description="Requests at fixed concurrencies (a sweep) or on Poisson arrivals, measured "
                                       "at the client: TTFA quantiles, RTF, stall-free streams, per-stage times, "
                                       "errors by code. Prints a table; --out writes bench.json, bench.md, plots.")
    bench.add_argument("--target", default=GATEWAY_TARGET)
    bench.add_argument("--concurrency", type=concurrencies, default=[1],
                       help="concurrent streams, or a comma-separated sweep (1,4,16,32,64,128)")
    bench.add_argument("--rate", type=rates, help="Poisson arrivals (requests/s) instead of fixed concurrency, or a "
                                                  "comma-separated sweep of them (10,20,30,40: offered load against "
                                                  "goodput, the knee)")
    bench.add_argument("--ramp", type=seconds, default=0.0,
                       help="seconds over which a level's streams start, evenly spaced (default 0: all at once)")
    bench.add_argument("--requests", type=positive(int), default=None,
                       help="requests per level (default: 4 x the concurrency, at least 8; with --rate: --seconds of arrivals)")
    bench.add_argument("--seconds", type=positive(float), default=30.0,
                       help="with --rate and no --requests: seconds of arrivals per rate (default 30)")
    bench.add_argument("--prompts", help="a UTF-8 file, one prompt per line (default: built-in prompts)")
    bench.add_argument("--warmup", type=count, default=2, help="requests sent first and not counted")
    bench.add_argument("--max-new-tokens", type=positive(int), default=75, help="audio tokens per request (80 ms each)")
    bench.add_argument("--min-new-tokens", type=count, default=None,
                       help="end of speech suppressed before this many (default: --max-new-tokens: fixed-length audio)")
    bench.add_argument("--reply-seconds", type=span, metavar="LO-HI",
                       help="each reply's length drawn uniformly from LO to HI seconds, exact (e.g. 2-20: a voice "
                            "assistant's mix); instead of --max-new-tokens and --min-new-tokens")
    bench.add_argument("--first-chunk-tokens", type=positive(int),
                       help="the requests' first (and second) chunk, in tokens (default: the service's, 8)")
    bench.add_argument("--turns", type=count, default=0,
                       help="each request a Converse session of this many turns, each sent once the reply before it "
                            "has played out (plus --turn-gap); measured per turn (default 0: Synthesize calls)")
    bench.add_argument("--speech", metavar="WAV",
                       help="every turn spoken: the file streamed as it would be spoken (Converse sessions of --turns "
                            "turns, at least 1), then its end; TTFA then runs from the end of the speech")
    bench.add_argument("--barge-in", type=seconds, metavar="SECONDS",
                       help="with --speech: hands-free sessions (the gateway finds where the speech starts and ends) "
                            "whose user speaks again SECONDS after the reply's first audio, over it; reports how long "
                            "the old reply's audio still arrived after the new speech began, and the new turn's end of "
                            "speech to first audio. Give replies long enough to be spoken over (--reply-seconds)")
    bench.add_argument("--encoder-metrics", metavar="URL",
                       help="with --speech: the encoder's Prometheus /metrics, whose speaker places in use are sampled "
                            "during each level and reported (default: this host's, at moss-serve up's encoder metrics "
                            f"port, http://127.0.0.1:{METRICS_PORTS['encoder']}/metrics)")
    bench.add_argument("--turn-gap", type=seconds, default=0.5,
                       help="seconds between a reply played out at the client and the next turn (default 0.5)")
    bench.add_argument("--timeout", type=positive(float), default=120.0,
                       help="seconds for a request, a whole session with --turns (default 120)")
    bench.add_argument("--api-key", default=os.environ.get("MOSS_API_KEY"), help="sent as 'authorization: Bearer <key>' "
                                                                               "(default: $MOSS_API_KEY)")
    _client_tls_options(bench)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--out", help="a directory for bench.json, bench.md and the PNG plots")
    bench.add_argument("--no-progress", action="store_true", help="no live progress bar")


def run_say(args) -> int:
    import grpc
    from moss.speech.v1 import common_pb2

    from services.common.audio import write_wav
    from services.gateway.client import converse, print_timings

    tls, error = _client_tls(args, "say")
    if error:
        print(error, file=sys.stderr)
        return 2

    if (args.text is None) == (args.audio is None):
        print("moss-serve say: give the text, or --audio WAV", file=sys.stderr)
        return 2
    try:  # the user's mistakes said before any call: the speech read, the output's place checked
        speech = _speech(args.audio)
        if args.reply == "speech":
            _check_writable(args.output)
    except ValueError as err:
        print(f"moss-serve say: {err}", file=sys.stderr)
        return 2
    from moss.speech.v1 import gateway_pb2

    reply = gateway_pb2.REPLY_MODALITY_TEXT if args.reply == "text" else gateway_pb2.REPLY_MODALITY_SPEECH

    async def one_turn():  # a conversation of one turn
        async with converse(args.target, voice=args.voice, sampling=common_pb2.SamplingParams(**_sampling_fields(args)),
                            timeout=args.timeout, api_key=args.api_key, tls=tls) as conv:
            if speech is None:
                return await conv.say(args.text, reply=reply)
            return await conv.speak(*speech, reply=reply)

    try:
        result = asyncio.run(one_turn())
    except grpc.aio.AioRpcError as err:
        print(f"moss-serve say: {err.code().name}: {err.details()}", file=sys.stderr)
        return 1
    if result.failed is not None:
        hint = f" (retry after {result.failed.retry_after_seconds:.1f} s)" if result.failed.retry_after_seconds else ""
        print(f"moss-serve say: {result.failed.code}: {result.failed.message}{hint}", file=sys.stderr)
        return 1
    if result.text:
        print(f"text: {result.text}")
    if args.reply == "speech":
        try:
            write_wav(args.output, result.samples, result.sample_rate)
        except OSError as err:
            print(f"moss-serve say: cannot write {args.output}: {err.strerror or err}", file=sys.stderr)
            return 1
    print_timings(result, args.output if args.reply == "speech" else None)
    return 0


def _sampling_fields(args) -> dict:
    return {k: v for k, v in (("temperature", args.temperature), ("max_new_tokens", args.max_new_tokens),
                              ("seed", args.seed)) if v is not None}


def run_chat(args) -> int:
    from services.chat import run

    tls, error = _client_tls(args, "chat")
    if error:
        print(error, file=sys.stderr)
        return 2
    return run(args, tls, _sampling_fields(args))


def run_bench(args, argv: list[str]) -> int:
    from services.bench.load import LoadSpec
    from services.bench.sweep import run
    from services.bench.workload import load_prompts

    try:
        prompts = load_prompts(args.prompts)
        speech = _speech(args.speech)
        if args.barge_in is not None and speech is None:
            raise ValueError("--barge-in needs --speech WAV: what the user says, twice")
    except (OSError, ValueError) as err:
        print(f"moss-serve bench: {err}", file=sys.stderr)
        return 2
    try:  # made now, not after the first level's minutes
        if args.out:
            os.makedirs(args.out, exist_ok=True)
    except OSError as err:
        print(f"moss-serve bench: cannot write in {args.out}: {err.strerror or err}", file=sys.stderr)
        return 2
    tls, error = _client_tls(args, "bench")
    if error:
        print(error, file=sys.stderr)
        return 2
    spec = LoadSpec(target=args.target, prompts=prompts, requests=args.requests, ramp=args.ramp,
                    max_new_tokens=args.max_new_tokens,
                    min_new_tokens=args.max_new_tokens if args.min_new_tokens is None else args.min_new_tokens,
                    timeout=args.timeout, first_chunk_tokens=args.first_chunk_tokens, api_key=args.api_key, tls=tls, seed=args.seed,
                    progress=not args.no_progress, turns=args.turns, turn_gap=args.turn_gap, speech=speech,
                    reply_seconds=args.reply_seconds, arrival_seconds=args.seconds, barge_in=args.barge_in,
                    encoder_metrics=(args.encoder_metrics or f"http://127.0.0.1:{METRICS_PORTS['encoder']}/metrics")
                    if speech is not None else None)
    return run(spec, args.concurrency, args.warmup, args.out, "moss-serve bench " + " ".join(argv), rates=args.rate)


def _speech(path: str | None):
    """A speech file (--audio, --speech) → (mono float samples, rate), or None; ValueError saying why it cannot be
    read."""
    from services.common.audio import read_audio

    return None if path is None else read_audio(path)


def _check_writable(path: str) -> None:
    """ValueError unless a file can be written at `path` (its directory there, writable)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ValueError(f"cannot write {path}: no directory {directory}")
    if os.path.isdir(path):
        raise ValueError(f"cannot write {path}: a directory")
    if not os.access(directory, os.W_OK):
        raise ValueError(f"cannot write {path}: not writable")
