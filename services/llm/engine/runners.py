"""Which step runner an engine gets (services/llm/runner/: reference, kernels, trt), built from its config, and what
its KV budget pays per position."""

from __future__ import annotations

import torch

from services.common.tensors import Uploader
from services.llm.engine.config import EngineConfig
from services.llm.model.config import MossSpeechConfig
from services.llm.model.model import MossSpeechForCausalLM
from services.llm.runner.kernel_runner import KernelRunner
from services.llm.runner.torch_runner import ModelRunner


def runner_kind(config: EngineConfig, device: torch.device) -> str:
    """auto: the kernel runner on CUDA, or wherever the weights are quantized (only it runs FP8 layers); else the
    reference runner."""
    if config.runner != "auto":
        return config.runner
    return "kernels" if device.type == "cuda" or config.quantization != "none" else "reference"


def bytes_per_position(cfg: MossSpeechConfig, config: EngineConfig, device: torch.device) -> int:
    """What the KV budget pays per position: K/V of every layer, and for a text branch skipped while
    speaking the kept trunk output (hidden_size values: ~5% more at the real size)."""
    kind = runner_kind(config, device)
    itemsize = cfg.kv_bytes_per_token // (cfg.num_layers * 2 * cfg.num_key_value_heads * cfg.head_dim)
    return cfg.kv_bytes_per_token + (cfg.hidden_size * itemsize if kind == "kernels" and config.text_skip else 0)


def make_runner(model: MossSpeechForCausalLM, num_blocks: int, device: torch.device, config: EngineConfig,
                upload: Uploader | None = None):
    kind = runner_kind(config, device)
    if kind == "reference":
        if config.quantization != "none":
            raise ValueError(f"--quantization {config.quantization} needs the kernel runner, not the reference runner")
        return ModelRunner(model, num_blocks, config.block_size, device)
    if kind == "kernels":
        return KernelRunner(model, num_blocks, config.block_size, device, config.max_num_seqs, config.max_model_len,
                            kernels=config.kernels, cuda_graphs=config.cuda_graphs, upload=upload,
                            max_num_batched_tokens=config.max_num_batched_tokens, text_skip=config.text_skip,
                            quantization=config.quantization)
    if kind == "trt":
        from services.llm.runner import trt_runner  # (no torch kernels, no tensorrt, unless asked for)

        if config.engine_dir is None:
            raise ValueError("the trt runner needs an engine directory (--engine-dir)")
        if config.quantization != "none":
            raise ValueError("--quantization is the engine's build option with the trt runner (docs/tensorrt.md)")
        return trt_runner.TrtRunner(model.cfg, config.engine_dir, num_blocks, config.block_size, device,
                                    config.max_num_seqs, config.max_model_len, config.max_num_batched_tokens,
                                    trt=trt_runner.load_tensorrt())
    raise ValueError(f"unknown runner {config.runner!r}: kernels, reference, trt or auto")
