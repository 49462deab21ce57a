"""Build the llm service from its settings and serve it."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time
from pathlib import Path

import torch
from moss.speech.v1 import llm_pb2, llm_pb2_grpc

from services.common.device import fatal_signal, open_context, use_cpu_threads
from services.common.device import lost as device_lost
from services.common.memory import GiB, Pool, check_weights, size_gib
from services.common.metrics import start_metrics_server
from services.common.server import serve
from services.llm import metrics
from services.llm.async_engine import AsyncEngine
from services.llm.engine.engine import EngineConfig, LLMEngine
from services.llm.engine.warmup import warm_up
from services.llm.model.checkpoint import DTYPES, load_pretrained, random_model
from services.llm.model.config import MossSpeechConfig, preset
from services.llm.model.model import MossSpeechForCausalLM
from services.llm.model.tokenizer import load_tokenizer, preset_tokenizer
from services.llm.model.trtllm_checkpoint import read_config
from services.llm.servicer import LlmServicer
from services.llm.settings import LlmSettings, audio_lead, default_kv_cache_gb, first_audio_hold, max_num_seqs

log = logging.getLogger(__name__)


def resolve_dtype(name: str, device: torch.device, model_dir: str | None) -> torch.dtype | None:
    """The dtype to build in; None: the checkpoint's own (config.json's torch_dtype)."""
    if name != "auto":
        return DTYPES[name]
    if model_dir:
        return None
    return torch.bfloat16 if device.type == "cuda" else torch.float32


KV_POOL = Pool("llm", "the KV cache", "--kv-cache-gb", "GiB")


def build_engine(s: LlmSettings) -> LLMEngine:
    device = torch.device(s.device)
    if s.busy_share and (device.type != "cuda" or s.runner not in ("auto", "kernels") or not 1 <= s.busy_share <= 100):
        raise ValueError(f"--busy-share {s.busy_share}: a percentage, 1 to 100, of a GPU's multiprocessors, for the "
                         f"kernel runner on CUDA (0: off)")
    if s.busy_share:
        from services.common.green_context import unavailable

        if reason := unavailable():  # (MPS cannot give the share instead: the process's share is fixed at its start)
            raise ValueError(f"--busy-share {s.busy_share} needs CUDA green contexts: {reason}. Start the llm without it, "
                             f"with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={s.busy_share} under MPS instead")
    config = EngineConfig(
        block_size=s.block_size, max_num_seqs=max_num_seqs(s),  # (the KV budget: _sized_kv, once the weights are in)
        max_num_batched_tokens=s.max_num_batched_tokens, max_model_len=s.max_model_len, max_audio_lead=audio_lead(s),
        first_audio_window=s.first_audio_window, first_audio_hold=first_audio_hold(s), quantization=s.quantization,
        runner=s.runner, engine_dir=s.engine_dir, busy_share=s.busy_share, whole_gpu_turns=s.whole_gpu_turns,
    )
    if s.runner == "trt":
        return _trt_engine(s, _sized_kv(s, config, device), device)
    dtype = resolve_dtype(s.dtype, device, s.model_dir)
    started = time.perf_counter()
    check_weights_fit(MossSpeechConfig.from_json(Path(s.model_dir) / "config.json") if s.model_dir else preset(s.preset),
                      dtype, device)
    if s.model_dir:
        model = load_pretrained(s.model_dir, device=device, dtype=dtype)
        tokenizer = load_tokenizer(s.model_dir)
        log.info("loaded %s from %s on %s", model.cfg.to_dict()["architectures"][0], s.model_dir, device)
    else:
        cfg = preset(s.preset)
        model = random_model(cfg, device=device, dtype=dtype, seed=s.seed)
        tokenizer = preset_tokenizer(cfg)
        log.warning("no --model-dir: serving the %r preset with RANDOM weights (speech will be noise)", s.preset)
    _match_config_dtype(model)
    log.info("weights and KV cache in %s; the weights took %.1f s", next(model.parameters()).dtype,
             time.perf_counter() - started)
    started = time.perf_counter()
    engine = LLMEngine(model, tokenizer, _sized_kv(s, config, device))
    log.info("llm: the KV cache and the runner (its CUDA graphs on a GPU) ready in %.1f s", time.perf_counter() - started)
    if engine.share is not None:
        log.info("llm: %s", engine.share.describe())
    return engine


def check_weights_fit(cfg: MossSpeechConfig, dtype: torch.dtype | None, device: torch.device) -> None:
    """NotEnoughMemory, before a byte of them is allocated, where the weights do not fit the device's free memory."""
    dtype = dtype or DTYPES.get(cfg.torch_dtype, torch.float32)
    n = cfg.num_parameters
    name = {v: k for k, v in DTYPES.items()}.get(dtype, str(dtype))
    advice = ("give --dtype bfloat16 (half of float32's), or serve it on a GPU (--device cuda)"
              if device.type == "cpu" and dtype == torch.float32 else "serve it on a device with more memory")
    check_weights("llm", f"the weights ({n / 1e9:.2f} B parameters in {name})", n * dtype.itemsize, device, advice)


def _sized_kv(s: LlmSettings, config: EngineConfig, device: torch.device) -> EngineConfig:
    """The KV pool's budget, the weights in place: --kv-cache-gb if it fits (else NotEnoughMemory), or the device's
    default (settings.py's default_kv_cache_gb) where half the free memory holds it (less where not:
    services/common/memory.py)."""
    gib = size_gib(KV_POOL, s.kv_cache_gb, default_kv_cache_gb(s), device)
    return dataclasses.replace(config, kv_cache_bytes=int(gib * GiB))


def _trt_engine(s: LlmSettings, config: EngineConfig, device: torch.device) -> LLMEngine:
    """The engine over a TensorRT-LLM engine directory: the model's config from it, no weights in torch (the engine
    holds them); the tokenizer from the engine directory, or --model-dir's."""
    if not s.engine_dir:
        raise ValueError("--runner trt needs --engine-dir (docs/tensorrt.md)")
    _, cfg = read_config(s.engine_dir)
    source = s.model_dir or s.engine_dir
    if not (Path(source) / "tokenizer.json").exists():
        raise ValueError(f"{source}: no tokenizer.json (copy the checkpoint's into the engine directory, or give "
                         "--model-dir)")
    with torch.device("meta"):
        model = MossSpeechForCausalLM(dataclasses.replace(cfg, torch_dtype=_engine_dtype(s.engine_dir)))
    log.info("serving the TensorRT-LLM engine in %s on %s", s.engine_dir, device)
    return LLMEngine(model, load_tokenizer(source), config, device=device)


def _engine_dtype(engine_dir: str) -> str:
    """The engine's KV dtype (its checkpoint's dtype): what the KV budget pays per position."""
    pretrained, _ = read_config(engine_dir)
    return pretrained.get("dtype", "bfloat16")


def _match_config_dtype(model) -> None:
    """The engine sizes the KV pool by cfg.kv_bytes_per_token, which reads cfg.torch_dtype; the pool is
    allocated in the weights' dtype. Built in another dtype than the config's (float32 weights of a
    bfloat16 preset), the pool would be twice --kv-cache-gb: make the config say what was built."""
    name = {v: k for k, v in DTYPES.items()}[next(model.parameters()).dtype]
    if model.cfg.torch_dtype != name:
        model.cfg = dataclasses.replace(model.cfg, torch_dtype=name)


async def run(s: LlmSettings) -> None:
    use_cpu_threads("llm", s.cpu_threads)
    open_context("llm", s.device)
    llm = build_engine(s)
    if s.device.startswith("cuda"):  # first uses of kernels and code paths, before any request meets them
        started = time.perf_counter()
        ran = warm_up(llm)
        log.info("llm: warm-up of %d synthetic turns in %.1f s", ran, time.perf_counter() - started)
    fatal, report = fatal_signal(asyncio.get_running_loop())  # the device lost: stop serving, exit (device.py)
    engine = AsyncEngine(llm, on_step=metrics.observe_step, on_load=metrics.observe_load, on_hold=metrics.observe_hold,
                         lost=lambda: device_lost(s.device), on_fatal=report)
    # The model, torch's modules and the captured graphs are hundreds of thousands of long-lived objects:
    # frozen, a full collection no longer walks them (otherwise ~20 ms pauses in the engine thread, a
    # stall in every stream; measured in bench/llm_engine.py's per-step maxima on an H100).
    gc.collect()
    gc.freeze()
    metrics.observe_load(engine.engine.load())
    engine.start()
    start_metrics_server(s.host, s.metrics_port)
    await serve(
        name="llm",
        full_service_name=llm_pb2.DESCRIPTOR.services_by_name["Llm"].full_name,
        host=s.host,
        port=s.port,
        add_servicer=lambda server: llm_pb2_grpc.add_LlmServicer_to_server(LlmServicer(engine), server),
        on_done=metrics.observe_request,
        on_stop=engine.stop,
        tls=s.tls,
        fatal=fatal,
    )
