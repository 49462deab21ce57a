"""The vocoder service's settings, each option declared once (services/settings.py): `moss-serve vocoder` takes them
all, `moss-serve up` the FORWARDED ones (the worker's and the codec decoder's), which it hands on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from services.settings import (
    OWN,
    PROCESSES,
    VOCODER,
    count,
    cpu_threads_option,
    host_option,
    metrics_port_option,
    option,
    port_option,
    positive,
    seconds,
)
from services.vocoder.solve_worker import DEFAULT_ADMIT_EVERY, DEFAULT_GENERATE_WAIT, DEFAULT_SOLVE_ROWS
from services.vocoder.worker import DEFAULT_FIRST_CHUNK_BUDGET, FLOW_LIMITS, STAND_IN_LIMITS, CallLimits

if TYPE_CHECKING:  # (grpc's: not imported for `moss-serve --help`)
    from services.common.tls import ServerTls

PRESETS = ("tiny", "tiny-codec", "moss-speech")  # services/vocoder/loader.py's presets (not imported: torch)


@dataclass
class VocoderSettings:
    GROUP: ClassVar[str] = VOCODER
    GROUPS: ClassVar[dict[str, tuple[str, ...]]] = {PROCESSES: ("host", "port", "metrics_port", "device", "cpu_threads")}

    host: str = host_option()
    port: int = port_option("vocoder")
    metrics_port: int = metrics_port_option("vocoder")
    vocoder_dir: str | None = option(
        None, "the codec decoder's directory (codec.json, flow.pt, hift.pt, voices/), or a BigVGAN-v2 directory for the "
              "stand-in decoder (config.json, bigvgan_generator.pt[, token_decoder.*]); without it: the --preset with "
              "random weights", scope=OWN)
    preset: str = option("tiny-codec", "moss-speech: the codec's flow + HiFT at their real size; tiny-codec: the same, "
                                       "small (the tiny llm's codes); tiny: a stand-in decoder and a small BigVGAN "
                                       "(24 kHz, 80 bands, hop 480 all), for tests of the vocoder's own streaming",
                         choices=PRESETS, scope=OWN)
    device: str = option("cpu", "cpu or cuda", scope=OWN)
    cpu_threads: int | None = cpu_threads_option()
    left_context: int | None = option(None, "mel frames of left context per chunk (default: the generator's receptive "
                                            "field)", type=count, scope=OWN)
    lookahead: int | None = option(None, "mel frames held back for the next chunk (default 4: one token, 80 ms at hop "
                                         "480)", type=count, scope=OWN)
    # The worker's options (worker.py): `up` hands them on.
    # Their defaults are the decoder's (worker.CallLimits): the codec's flow and the stand-in trade differently.
    max_batch: int | None = option(None, "windows per model call (a first chunk never waits behind a long call; "
                                         f"default: the codec's flow {FLOW_LIMITS.max_batch}, the stand-in "
                                         f"{STAND_IN_LIMITS.max_batch})", type=positive(int))
    max_batch_frames: int | None = option(None, "mel frames per model call, all windows together (default: the codec's "
                                                f"flow {FLOW_LIMITS.max_batch_frames}, the stand-in "
                                                f"{STAND_IN_LIMITS.max_batch_frames})", type=positive(int))
    first_chunk_budget: float = option(DEFAULT_FIRST_CHUNK_BUDGET, "seconds after it comes in that a stream's first "
                                       "chunk is due; chunks are vocoded earliest deadline first (0: first chunks first)",
                                       type=seconds)
    first_chunk_batch_frames: int | None = option(None, "mel frames of a model call that carries a stream's first "
                                                        "chunk: a shorter call, sooner first audio (0: "
                                                        "--max-batch-frames alone; default: the codec's flow "
                                                        f"{FLOW_LIMITS.first_chunk_batch_frames}, the stand-in "
                                                        f"{STAND_IN_LIMITS.first_chunk_batch_frames})", type=count)
    urgent_seconds: float = option(0.0, "a model call whose most urgent chunk is due within this many seconds (under "
                                        "load, a stream's second chunk) takes only such chunks, so that it is short; "
                                        "the chunks with more time wait for the next call (0: off; worker.py)",
                                   type=seconds)
    first_chunk_lane: str | None = option(
        None, "vocode streams' first chunks on a second worker thread, in small calls on a CUDA stream of high priority "
              "beside the playing streams' calls: sooner first audio under load, and under headroom admission more "
              "turns admitted; under count admission past the knee, more stalls (docs/benchmarks.md) (default: on where "
              "moss-serve up runs the stack on a GPU, else off)", choices=["on", "off"], show_default=False)
    graphs_before_serving: str = option(
        "covers", "on a GPU, the CUDA graphs captured before the vocoder serves: covers (each kind's largest, into which "
                  "the calls of shapes not captured yet are padded; the rest while serving, when the vocoder is idle, "
                  "one window's calls first), first (the covers and one window's calls: ~5 s more at the real size) or "
                  "all (every graph: ~1 min more; capture.py)", choices=["covers", "first", "all"])
    # The codec decoder's options (docs/codec.md): `up` hands them on.
    voices_dir: str | None = option(None, "the flow decoder's voices, <name>.safetensors each (default: the codec "
                                          "directory's voices/; a preset without it: one random 'default' voice)")
    max_voices: int | None = option(None, "voices the flow holds in all, those of --voices-dir and those added while "
                                          "serving (the prompt prefix keeps a place for each: ~321 MB at the real size "
                                          "with a 3.2 s prompt; AddVoice past them is refused; a removed voice's place "
                                          "is a new voice's once its streams have ended) (default: the directory's "
                                          "and 4 more)", type=positive(int))
    speaker_model: str | None = option(None, "the speaker-embedding model in ONNX (CosyVoice2's campplus.onnx) that "
                                             "AddVoice makes a recording's x-vector with (without it, a voice made "
                                             "through the API is refused saying so)")
    generator: str | None = option(None, "with a codec directory: its HiFT (default), or the BigVGAN-v2 beside it "
                                         "(config.json, bigvgan_generator.pt) trained on the flow's mel format",
                                   choices=["hift", "bigvgan"])
    flow_block_tokens: int | None = option(None, "tokens the flow decodes at a time, once the look-ahead tokens after "
                                                 "them are in (default 5)", type=positive(int))
    flow_context_tokens: int | None = option(None, "latest tokens a block is decoded with, itself and its look-ahead "
                                                   "included (default 40)", type=positive(int))
    flow_history_streams: int | None = option(None, "streams whose solved frames the flow keeps, so that each call "
                                                    "solves only their new frames (default: 128, or as many as fit in "
                                                    "half the device's free memory; given, it must fit or the vocoder "
                                                    "refuses to start; 0: none, every block over its window; memory: "
                                                    "docs/codec.md)", type=count)
    flow_history_frames: int | None = option(None, "a stream's latest frames kept for its next blocks to read "
                                                   "(default 40)", type=positive(int))
    generator_overlap: str = option("off", "the playing streams' calls pipelined: a call's generator on a CUDA stream "
                                           "of its own, beside the next call's token decoder (on a GPU, not with "
                                           "--flow-solve on; pipelined_worker.py)", choices=["on", "off"])
    flow_encoder_window: int = option(0, "with the stream history, each stream's encoder state kept too: a call runs "
                                         "the flow's token encoder over its new tokens only, reading this many kept "
                                         "positions before them (0: off, the encoder runs over prompt + window; on an "
                                         "H200 128 was slower: docs/codec.md)", type=count)
    flow_solve: str = option("off", "the flow's solve batched at the Euler step (on: a stream's block joins the running "
                                    "solve at the next tick instead of waiting for the flow call in flight; needs the "
                                    "stream history; slower than calls at 128 streams on an H100: docs/codec.md)",
                             choices=["on", "off"])
    flow_solve_rows: int = option(DEFAULT_SOLVE_ROWS, "rows in the flow's solve at most (--flow-solve on; CUDA graphs up "
                                                      "to 64)", type=positive(int))
    flow_admit_every: int = option(DEFAULT_ADMIT_EVERY, "ticks between admissions to the flow's solve of chunks not yet "
                                                        "urgent (--flow-solve on)", type=positive(int))
    flow_generate_wait: float = option(DEFAULT_GENERATE_WAIT, "seconds a solved chunk that is not yet urgent may wait "
                                                              "to share a generator call (--flow-solve on)", type=seconds)
    flow_steps: int | None = option(None, "Euler steps of the flow (default 10)", type=positive(int))
    flow_cfg_rate: float | None = option(None, "classifier-free guidance rate of the flow, 0 or more (default 0.7)",
                                         type=seconds)
    seed: int = 0
    tls: ServerTls | None = None  # TLS on the gRPC port (mutual with a client CA: only the gateway gets in)

    def call_limits(self, flow: bool) -> CallLimits:
        """The worker's limits on a call: those given, the decoder's (flow: the codec's) for the rest."""
        mine = FLOW_LIMITS if flow else STAND_IN_LIMITS
        return CallLimits(*(getattr(mine, f) if getattr(self, f) is None else getattr(self, f)
                            for f in ("max_batch", "max_batch_frames", "first_chunk_batch_frames")))
