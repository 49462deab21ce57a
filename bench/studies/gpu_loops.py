"""The two loops `bench/studies/gpu_sharing.py` runs side by side, each in a child process: the llm's decode steps and the
vocoder's steady flow calls; or in the llm's place one of bench/studies/gpu_neighbors.py's stand-ins."""

from __future__ import annotations

import time

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch

from measure import sync


class LlmLoop:
    """B sequences decoding, stepped back to back."""

    def __init__(self, size: str, device: torch.device, batch: int, context: int, kv_gb: float,
                 quantization: str = "none"):
        from llm_timing import Prompts

        from services.llm.engine.engine import EngineConfig, LLMEngine
        from services.llm.model.checkpoint import random_model
        from services.llm.model.config import preset
        from services.llm.model.tokenizer import tiny_tokenizer

        cfg = preset("moss-speech" if size == "real" else "tiny")
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        model = random_model(cfg, device=device, dtype=dtype)
        config = EngineConfig(kv_cache_bytes=int(kv_gb * (1 << 30)), max_num_seqs=batch, max_num_batched_tokens=2048,
                              max_model_len=min(8192, cfg.max_position_embeddings), quantization=quantization)
        self.engine = LLMEngine(model, tiny_tokenizer(preset("tiny")), config)
        self.batch, self.context, self.device = batch, context, device
        blocks = self.engine.block_manager.num_blocks
        # what the pool holds for each sequence, less its prompt and two blocks of margin
        self.new_tokens = min(blocks * config.block_size // batch, config.max_model_len) - context - 2 * config.block_size
        if self.new_tokens < 64:
            raise SystemExit(f"--kv-gb {kv_gb}: {blocks} blocks leave {self.new_tokens} tokens a sequence")
        self.prompts = Prompts(cfg)  # fresh random prompts: no prefix-cache hits

    def prepare(self) -> None:
        """Fresh sequences, stepped until all are decoding (their prefills are not timed)."""
        e = self.engine
        for seq_id in list(e.sequences):
            e.abort(seq_id)
        for _ in range(self.batch):
            e.add(e.make_sequence(self.prompts.request(self.context, self.new_tokens)))
        while e.scheduler.waiting or any(s.num_steps == 0 for s in e.scheduler.running):
            e.step()
        for _ in range(3):
            e.step()
        sync(self.device)

    def run(self, seconds: float) -> dict:
        e, steps = self.engine, 0
        # the sequences prefilled first began decoding while the others prefilled: the one furthest on bounds the run
        left = self.new_tokens - max(s.num_steps for s in e.scheduler.running) - 8
        start = time.perf_counter()
        while time.perf_counter() - start < seconds and steps < left:
            e.step()
            if e.last_step.decode_tokens != self.batch or e.last_step.prefill_tokens:
                raise RuntimeError(f"step {steps} was not a pure decode step of {self.batch}: {e.last_step}")
            steps += 1
        sync(self.device)
        wall = time.perf_counter() - start
        return {"loop": "llm", "steps": steps, "seconds": wall, "ms": wall / steps * 1e3}


class VocoderLoop:
    """Steady flow calls of W streams' 20-token windows, each waited for."""

    def __init__(self, size: str, device: torch.device, windows: int, variant: str = "defaults"):
        from codec_flow_profile import CHUNK, WARM_CHUNKS, steady_rows, use

        from services.vocoder.codec.checkpoint import random_codec
        from services.vocoder.codec.config import moss_speech, tiny
        from services.vocoder.codec.decoder import FlowTokenDecoder
        from services.vocoder.codec.voice import random_voice

        use(variant)  # the flow's kernels as codec_flow_profile's variant (before its graphs are captured)
        cfg = moss_speech() if size == "real" else tiny()
        voice = random_voice(cfg.flow, prompt_tokens=40, seed=3)
        g = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, cfg.flow.vocab_size, (windows, sum(WARM_CHUNKS) + CHUNK), generator=g).tolist()
        self.decoder = FlowTokenDecoder(random_codec(cfg, 0)[0], device, history_streams=windows)
        self.decoder.set_voices([voice])
        with torch.inference_mode():
            self.rows = steady_rows(self.decoder, voice, tokens)
        self.windows, self.device = windows, device

    def prepare(self) -> None:
        with torch.inference_mode():
            self.decoder.decode_chunks(self.rows)  # its graph, captured on the first call
        sync(self.device)

    def run(self, seconds: float) -> dict:
        calls, stream = 0, torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        start = time.perf_counter()
        with torch.inference_mode():
            while time.perf_counter() - start < seconds:
                self.decoder.decode_chunks(self.rows)
                if stream is not None:
                    stream.synchronize()  # the worker reads each call's audio back before the next
                calls += 1
        wall = time.perf_counter() - start
        return {"loop": "vocoder", "calls": calls, "seconds": wall, "ms": wall / calls * 1e3}


def neighbor_loop(args, device: torch.device):
    """The llm's loop, or a stand-in for it (bench/studies/gpu_neighbors.py)."""
    if args.neighbor == "llm":
        return LlmLoop(args.size, device, args.batch, args.context, args.kv_gb, args.quantization)
    import gpu_neighbors

    if args.neighbor.startswith("llm-triton"):
        gpu_neighbors.patch_llm_products(args.neighbor, device)
        return LlmLoop(args.size, device, args.batch, args.context, args.kv_gb, args.quantization)
    if args.neighbor.startswith("read"):
        return gpu_neighbors.ReadLoop(device, "evict_first" if args.neighbor.endswith("evict-first") else "")
    return gpu_neighbors.SpinLoop(device)
