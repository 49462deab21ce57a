"""The services' command-line options: the argparse types, and the option groups that a service's own command
and `moss-serve up` (which forwards them to it) both take, with the same names and defaults."""

from __future__ import annotations

import argparse
import math

from services.llm.model.config import PRESETS
from services.vocoder.worker import (
    DEFAULT_FIRST_CHUNK_BATCH_FRAMES,
    DEFAULT_FIRST_CHUNK_BUDGET,
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_BATCH_FRAMES,
)

# The llm engine's options: `moss-serve llm` takes them, `moss-serve up` forwards them to its llm.
ENGINE_OPTIONS = ("preset", "dtype", "kv_cache_gb", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                  "max_audio_lead", "first_audio_window", "first_audio_hold")
# The vocoder worker's options: `moss-serve vocoder` takes them, `moss-serve up` forwards them.
WORKER_OPTIONS = ("max_batch", "max_batch_frames", "first_chunk_budget", "first_chunk_batch_frames")
VOCODER_PRESETS = ("tiny", "tiny-codec", "moss-speech")  # services/vocoder/vocoder.py PRESETS (not imported: torch)
# The codec decoder's options: `moss-serve vocoder` takes them, `moss-serve up` forwards them.
CODEC_OPTIONS = ("voices_dir", "generator", "flow_block_tokens", "flow_context_tokens", "flow_steps", "flow_cfg_rate")
# Pacing's default on CUDA, seconds of audio a stream may have sent beyond what its listener has heard: when a
# stream falls to it, its next chunk (up to 20 steps) and that chunk's vocoding must fit in what is left, under
# load too. Its gain is not established: the runs that compared 1.0 s, 1.5 s and none shared the GPU with
# stacks left running (docs/benchmarks.md, fourth sweep); every run since had it on.
CUDA_AUDIO_LEAD = 1.5
# The first-audio hold's defaults: the codec decoder's first window at the real size (a first block of 5 tokens and
# its 3 look-ahead tokens, for prompts of whole blocks: services/vocoder/codec/decoder.py), and about the time it
# takes to vocode alone on an H100 (41 ms with the llm held, 61 with it stepping; docs/benchmarks.md, issue 20).
FIRST_AUDIO_WINDOW = 8
CUDA_FIRST_AUDIO_HOLD = 0.04
# The gateway's options: `moss-serve gateway` takes them, `moss-serve up` forwards them to its gateway.
GATEWAY_OPTIONS = ("max_text_chars", "ready_wait", "health_check_seconds", "api_keys_file", "max_turns",
                   "max_queued_turns", "max_message_bytes", "max_streams_per_connection", "session_idle_seconds")


def _number(kind, text: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a{'n integer' if kind is int else ' number'}: {text!r}") from None


def positive(kind):
    """An argparse type: a positive, finite `kind` (argparse turns the error into a usage message)."""
    def parse(text: str):
        value = _number(kind, text)
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value
    return parse


def count(text: str) -> int:
    """An argparse type: a whole number, 0 or more (frames, requests, tokens)."""
    value = _number(int, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds, 0 or more."""
    value = _number(float, text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return value


def power_of_two(text: str) -> int:
    value = positive(int)(text)
    if value & (value - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two, got {value}")
    return value


def targets(text: str) -> list[str]:
    """An argparse type: HOST:PORT addresses, comma-separated."""
    targets = [part.strip() for part in text.split(",") if part.strip()]
    for target in targets:
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise argparse.ArgumentTypeError(f"not HOST:PORT: {target!r}")
    if not targets:
        raise argparse.ArgumentTypeError("no address given")
    return targets


def gpu_list(text: str) -> list[str]:
    """An argparse type: distinct CUDA device indices, comma-separated."""
    gpus = [part.strip() for part in text.split(",")]
    if not all(gpu.isdigit() for gpu in gpus) or len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"not distinct GPU indices: {text!r}")
    return gpus


def concurrencies(text: str) -> list[int]:
    """An argparse type: positive integers, comma-separated."""
    return [positive(int)(part.strip()) for part in text.split(",")]


def engine_options(p: argparse.ArgumentParser) -> None:
    """ENGINE_OPTIONS, with the same names and defaults for `llm` and `up`."""
    p.add_argument("--preset", default="tiny", choices=list(PRESETS),
                   help="model preset used without --model-dir: random weights at its dimensions (default tiny)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                   help="weights and KV cache; auto: the checkpoint's, or bfloat16 on CUDA and float32 on CPU")
    p.add_argument("--kv-cache-gb", type=positive(float), default=1.0, help="memory budget of the KV-cache pool (default 1)")
    p.add_argument("--block-size", type=power_of_two, default=16, help="positions per KV-cache block (default 16)")
    p.add_argument("--max-num-seqs", type=positive(int), default=16, help="requests in the running batch (default 16)")
    p.add_argument("--max-num-batched-tokens", type=positive(int), default=512,
                   help="positions per engine step; longer prompts are prefilled in chunks (default 512)")
    p.add_argument("--max-model-len", type=positive(int), default=4096,
                   help="prompt + history + generated positions (default 4096)")
    p.add_argument("--max-audio-lead", type=seconds, default=None,
                   help="pace speech: hold steps while every stream has this many seconds of audio sent ahead of "
                        f"its listener, leaving the GPU to the vocoder (default: {CUDA_AUDIO_LEAD} on CUDA, where the "
                        "vocoder shares the GPU; 0, off, on CPU)")
    p.add_argument("--first-audio-window", type=count, default=FIRST_AUDIO_WINDOW,
                   help=f"audio tokens the vocoder needs before a stream's first audio (default {FIRST_AUDIO_WINDOW}, the "
                        "codec decoder's first block and look-ahead)")
    p.add_argument("--first-audio-hold", type=seconds, default=None,
                   help="once a stream's first audio window is sent, hold steps this long while every stream can "
                        "wait, so that the vocoder makes its first audio with the GPU to itself (default: "
                        f"{CUDA_FIRST_AUDIO_HOLD} on CUDA; 0, off, on CPU)")


def worker_options(p: argparse.ArgumentParser) -> None:
    """WORKER_OPTIONS, with the same names and defaults for `vocoder` and `up`."""
    p.add_argument("--max-batch", type=positive(int), default=DEFAULT_MAX_BATCH,
                   help=f"windows per model call (default {DEFAULT_MAX_BATCH}: a first chunk never waits behind a long call)")
    p.add_argument("--max-batch-frames", type=positive(int), default=DEFAULT_MAX_BATCH_FRAMES,
                   help=f"mel frames per model call, all windows together (default {DEFAULT_MAX_BATCH_FRAMES})")
    p.add_argument("--first-chunk-budget", type=seconds, default=DEFAULT_FIRST_CHUNK_BUDGET,
                   help="seconds after it comes in that a stream's first chunk is due; chunks are vocoded earliest "
                        f"deadline first (default {DEFAULT_FIRST_CHUNK_BUDGET}; 0: first chunks first)")
    p.add_argument("--first-chunk-batch-frames", type=count, default=DEFAULT_FIRST_CHUNK_BATCH_FRAMES,
                   help="mel frames of a model call that carries a stream's first chunk: a shorter call, sooner first "
                        f"audio (default {DEFAULT_FIRST_CHUNK_BATCH_FRAMES}; 0: --max-batch-frames alone)")


def codec_options(p: argparse.ArgumentParser) -> None:
    """CODEC_OPTIONS, with the same names and defaults for `vocoder` and `up` (docs/codec.md)."""
    p.add_argument("--voices-dir", help="the flow decoder's voices, <name>.safetensors each (default: the codec "
                                        "directory's voices/; a preset without it: one random 'default' voice)")
    p.add_argument("--generator", choices=["hift", "bigvgan"], default=None,
                   help="with a codec directory: its HiFT (default), or the BigVGAN-v2 beside it (config.json, "
                        "bigvgan_generator.pt) trained on the flow's mel format")
    p.add_argument("--flow-block-tokens", type=positive(int), default=None,
                   help="tokens the flow decodes at a time, once the look-ahead tokens after them are in (default 5)")
    p.add_argument("--flow-context-tokens", type=positive(int), default=None,
                   help="latest tokens a block is decoded with, itself and its look-ahead included (default 40)")
    p.add_argument("--flow-steps", type=positive(int), default=None, help="Euler steps of the flow (default 10)")
    p.add_argument("--flow-cfg-rate", type=seconds, default=None,
                   help="classifier-free guidance rate of the flow, 0 or more (default 0.7)")


def gateway_options(p: argparse.ArgumentParser) -> None:
    """GATEWAY_OPTIONS, with the same names and defaults for `gateway` and `up`."""
    p.add_argument("--max-text-chars", type=positive(int), default=2000, help="longest user turn taken (default 2000)")
    p.add_argument("--ready-wait", type=seconds, default=10.0,
                   help="seconds a request waits for a backend that is not ready (starting, restarting) before "
                        "UNAVAILABLE; always within the request's deadline (default 10)")
    p.add_argument("--health-check-seconds", type=positive(float), default=0.5,
                   help="how often a ready replica's health check is asked (one that is not ready: every 0.5 s at "
                        "most); a replica that fails it, or that a call finds unreachable, gets no calls until it "
                        "passes again (default 0.5)")
    p.add_argument("--api-keys-file", help="a file of API keys, one per line; clients send one as 'authorization: "
                                           "Bearer <key>' (more keys: $MOSS_API_KEYS, comma-separated; none: open)")
    p.add_argument("--max-turns", type=positive(int), default=256, help="turns running at once (default 256)")
    p.add_argument("--max-queued-turns", type=count, default=256,
                   help="turns waiting for a place, each within its deadline; beyond: RESOURCE_EXHAUSTED with a "
                        "retry hint (default 256)")
    p.add_argument("--max-message-bytes", type=positive(int), default=1 << 20,
                   help="largest request message taken; larger: RESOURCE_EXHAUSTED (default 1 MiB)")
    p.add_argument("--max-streams-per-connection", type=positive(int), default=100,
                   help="calls one client connection may have open at once; more wait on the client's side (default 100)")
    p.add_argument("--session-idle-seconds", type=positive(float), default=300.0,
                   help="a Converse session with no message from its client and no turn running for this long ends "
                        "(default 300)")


def forward(args, names: tuple[str, ...]) -> list[str]:
    """The flags that give a child process these options as `args` has them (None: the child's own default)."""
    flags = []
    for name in names:
        if (value := getattr(args, name)) is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    return flags


def first_audio_hold(args) -> float:
    """The llm's first-audio hold: as given, or CUDA_FIRST_AUDIO_HOLD on CUDA and 0 (off) on CPU."""
    if args.first_audio_hold is not None:
        return args.first_audio_hold
    return CUDA_FIRST_AUDIO_HOLD if args.device.startswith("cuda") else 0.0


def audio_lead(args) -> float:
    """The llm's pacing bound: as given, or CUDA_AUDIO_LEAD on CUDA and 0 (off) on CPU."""
    if args.max_audio_lead is not None:
        return args.max_audio_lead
    return CUDA_AUDIO_LEAD if args.device.startswith("cuda") else 0.0
