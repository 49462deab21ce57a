"""The llm service's settings, each option declared once (services/settings.py): `moss-serve llm` takes them all,
`moss-serve up` the FORWARDED ones (the engine's), which it hands on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from services.llm.engine.config import EngineConfig
from services.llm.model.config import PRESETS
from services.settings import (
    LLM,
    OWN,
    PROCESSES,
    count,
    cpu_threads_option,
    host_option,
    metrics_port_option,
    option,
    port_option,
    positive,
    power_of_two,
    seconds,
)

# Pacing's default on CUDA, seconds of audio a stream may have sent beyond what its listener has heard: when a
# stream falls to it, its next chunk (up to 20 steps) and that chunk's vocoding must fit in what is left, under
# load too (docs/benchmarks.md).
CUDA_AUDIO_LEAD = 1.5
# The first-audio hold's defaults: the codec decoder's first window at the real size (a first block of 5 tokens and
# its 3 look-ahead tokens, for prompts of whole blocks: services/vocoder/codec/decoder.py), and about the time it
# takes to vocode alone on an H100 (docs/benchmarks.md).
FIRST_AUDIO_WINDOW = 8
CUDA_FIRST_AUDIO_HOLD = 0.04
ENGINE = EngineConfig()  # the engine's defaults, which the engine's options take
# On a GPU the defaults are the stack as measured (docs/benchmarks.md: `moss-serve up --device cuda --preset
# moss-speech` on an H200, the loads of the "Where it stands" tables); the engine's own are a CPU's.
GPU_KV_CACHE_GB = 32.0
GPU_MAX_NUM_SEQS = 256

if TYPE_CHECKING:  # (grpc's: not imported for `moss-serve --help`)
    from services.common.tls import ServerTls


@dataclass
class LlmSettings:
    GROUP: ClassVar[str] = LLM
    GROUPS: ClassVar[dict[str, tuple[str, ...]]] = {PROCESSES: ("host", "port", "metrics_port", "device", "cpu_threads")}

    host: str = host_option()
    port: int = port_option("llm")
    metrics_port: int = metrics_port_option("llm")
    model_dir: str | None = option(None, "HF-format MOSS-Speech checkpoint (config.json, safetensors, tokenizer.json); "
                                         "without it: the --preset with random weights", scope=OWN)
    device: str = option("cpu", "cpu or cuda", scope=OWN)
    cpu_threads: int | None = cpu_threads_option()
    runner: str = option("auto", "what runs the model's steps: kernels (Triton kernels, CUDA graphs), reference "
                                 "(PyTorch), trt (a built TensorRT-LLM engine, --engine-dir: docs/tensorrt.md), or auto "
                                 "(kernels on CUDA, else reference)", choices=["auto", "kernels", "reference", "trt"],
                         scope=OWN)
    engine_dir: str | None = option(None, "--runner trt: the engine directory (config.json, rank0.engine; its "
                                          "tokenizer.json, or --model-dir's)", scope=OWN)
    # The engine's options (services/llm/engine/engine.py EngineConfig): `up` hands them on.
    preset: str = option("tiny", "model preset used without --model-dir: random weights at its dimensions",
                         choices=list(PRESETS))
    dtype: str = option("auto", "weights and KV cache; auto: the checkpoint's, or bfloat16 on CUDA and float32 on CPU",
                        choices=["auto", "bfloat16", "float16", "float32"], show_default=False)
    quantization: str = option(ENGINE.quantization, "the layers' GEMM weights and inputs: none (in --dtype) or fp8 "
                               "(e4m3, scaled per channel and per row: half the bytes a decode step reads; H100 or "
                               "newer on CUDA; the heads, attention and K/V stay in --dtype)", choices=["none", "fp8"])
    kv_cache_gb: float | None = option(None, f"memory budget of the KV-cache pool, GiB (default: "
                                             f"{ENGINE.kv_cache_bytes / (1 << 30):g} on a CPU, {GPU_KV_CACHE_GB:g} on a GPU, "
                                             "or half the device's free memory after the weights if less; given, it "
                                             "must fit or the llm refuses to start)", type=positive(float),
                                       show_default=False)
    block_size: int = option(ENGINE.block_size, "positions per KV-cache block", type=power_of_two)
    max_num_seqs: int | None = option(None, f"requests in the running batch (default: {ENGINE.max_num_seqs} on a "
                                            f"CPU, {GPU_MAX_NUM_SEQS} on a GPU)", type=positive(int), show_default=False)
    max_num_batched_tokens: int = option(ENGINE.max_num_batched_tokens, "positions per engine step; longer prompts are prefilled in chunks",
                                         type=positive(int))
    max_model_len: int = option(ENGINE.max_model_len, "prompt + history + generated positions", type=positive(int))
    max_audio_lead: float | None = option(
        None, "pace speech: hold steps while every stream has this many seconds of audio sent ahead of its listener, "
              f"leaving the GPU to the vocoder (default: {CUDA_AUDIO_LEAD} on CUDA, where the vocoder shares the GPU; "
              "0, off, on CPU)", type=seconds)
    first_audio_window: int = option(FIRST_AUDIO_WINDOW, "audio tokens the vocoder needs before a stream's first audio "
                                                         "(the codec decoder's first block and look-ahead)", type=count)
    first_audio_hold: float | None = option(
        None, "once a stream's first audio window is sent, hold steps this long while every stream can wait, so that "
              f"the vocoder makes its first audio with the GPU to itself (default: {CUDA_FIRST_AUDIO_HOLD} on CUDA; 0, "
              "off, on CPU)", type=seconds)
    busy_share: int = option(0, "percent of the GPU's multiprocessors the llm's steps take while more than "
                                "--whole-gpu-turns sequences ran in the last 2 s (a CUDA green context; the whole GPU "
                                "otherwise); 0: every step where the process runs. `moss-serve up` gives it "
                                "--mps-llm-threads and runs the llm at MPS 100%", type=int, scope=OWN)
    whole_gpu_turns: int = option(ENGINE.whole_gpu_turns, "with --busy-share: sequences at most for the whole GPU",
                                  type=count)
    seed: int = 0
    tls: ServerTls | None = None  # TLS on the gRPC port (mutual with a client CA: only the gateway gets in)


def first_audio_hold(s) -> float:
    """The first-audio hold of settings or arguments with `first_audio_hold` and `device`: as given, or
    CUDA_FIRST_AUDIO_HOLD on CUDA and 0 (off) on CPU."""
    if s.first_audio_hold is not None:
        return s.first_audio_hold
    return CUDA_FIRST_AUDIO_HOLD if s.device.startswith("cuda") else 0.0


def audio_lead(s) -> float:
    """The pacing bound of settings or arguments with `max_audio_lead` and `device`: as given, or CUDA_AUDIO_LEAD on
    CUDA and 0 (off) on CPU."""
    if s.max_audio_lead is not None:
        return s.max_audio_lead
    return CUDA_AUDIO_LEAD if s.device.startswith("cuda") else 0.0


def default_kv_cache_gb(s) -> float:
    """The KV cache's budget where --kv-cache-gb is not given (less where half the free memory is less: memory.py):
    a GPU's as measured, else the engine's own."""
    return GPU_KV_CACHE_GB if s.device.startswith("cuda") else ENGINE.kv_cache_bytes / (1 << 30)


def max_num_seqs(s) -> int:
    """--max-num-seqs, or where not given a GPU's as measured, else the engine's own."""
    if s.max_num_seqs is not None:
        return s.max_num_seqs
    return GPU_MAX_NUM_SEQS if s.device.startswith("cuda") else ENGINE.max_num_seqs
