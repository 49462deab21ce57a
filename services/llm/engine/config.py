"""The engine's settings and their defaults (plain values: the llm's command-line options take their defaults from
here, services/llm/settings.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    kv_cache_bytes: int = 1 << 30       # memory budget for the KV pool
    block_size: int = 16
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512   # positions per step: bounds a step's time while prompts stream in
    max_model_len: int = 4096           # prompt (with session history) + generated positions
    max_new_tokens_limit: int = 2048
    max_sessions: int = 1024            # sessions whose blocks are pinned for their next turn, at most (pins.py)
    runner: str = "auto"                # "kernels" (fused kernels, CUDA graphs), "reference", "trt" (a TensorRT-LLM
                                        # engine: engine_dir), or auto: kernels on CUDA
    engine_dir: str | None = None       # the TensorRT-LLM engine directory of runner "trt" (docs/tensorrt.md)
    kernels: str = "auto"               # the kernel runner's ops: "triton", "torch", or auto: triton on CUDA
    cuda_graphs: bool = True            # steps replay captured graphs (CUDA, Triton kernels)
    overlap: bool = True                # launch decode step N+1 before step N's samples reach the host
    text_skip: bool = True              # kernel runner: leave the text branch out of steps that sample no text, fill it in later
    quantization: str = "none"          # "fp8": the layers' GEMMs in FP8 (runner/fp8.py; the kernel runner)
    max_audio_lead: float = 0.0         # pacing, seconds (0: off): see LLMEngine.hold_seconds
    first_audio_window: int = 0         # audio tokens the vocoder needs for a stream's first audio (0: no hold)
    first_audio_hold: float = 0.0       # seconds steps may wait once a stream's first window is out: pacing.py
    audio_token_seconds: float = 0.08   # audio per audio token (the codec's 12.5 tokens/s)
    busy_share: int = 0                 # percent of the GPU's multiprocessors for steps while the stack is busy, on a
                                        # green context (0: every step where the process runs): gpu_share.py
    whole_gpu_turns: int = 2            # with busy_share: the whole GPU while at most this many sequences ran lately
