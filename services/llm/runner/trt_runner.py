"""The TensorRT-LLM runner: a built dual-head engine driven step by step, behind the runner contract of torch_runner.py
(`run(batch, feed) → (sampled, text logits, audio logits)`, `copy_blocks`), so that the engine, block manager,
scheduler, sampler and sessions are the same as the other runners'.

The KV pool is ours, in the layout the attention plugin reads (shared/DESIGN.md §3):
    kv_cache [num_blocks, num_layers, 2, kv_heads, block_size, head_dim]
and a request's block offsets are `block · 2·num_layers + field` (0 K, 1 V): the plugin adds `layer · 2` and reads
[kv_heads, block_size, head_dim] there. One pool holds all 40 layers (pool mapping: 0 for each).

Every step sets the shape and address of every input and output the engine lists (trt_io.py) from the block
manager's tables, with context requests first, as the plugin requires (their logits are put back in the batch's
order), checks every call's return value and the outputs' shapes, and leaves a NaN in each row's first logit before
the step: the engine overwrites it, and a step that did not run leaves it, so that the sampler, which fails a
request whose logits are not finite (alone, as with the other runners), catches it without a device → host read
that would stall the step launched ahead. A sampled row the engine left all zero gets a NaN too.

No TensorRT here where this is developed: `tensorrt` is imported when the runner is built (load_tensorrt), and the
tests give it a fake runtime that computes the model from the bound buffers (tests/fake_tensorrt.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from services.common.errors import Internal
from services.llm.batch import ScheduledBatch
from services.llm.model.config import MossSpeechConfig
from services.llm.model.trtllm_checkpoint import read_config
from services.llm.runner.trt_io import EngineIO, EngineRefused, TensorSpec, understand
from services.llm.sequence import Mode

ENGINE_FILE = "rank0.engine"
TORCH_DTYPES = {"int32": torch.int32, "int64": torch.int64, "float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16}
CONTEXT, GENERATION = 0, 1  # host_request_types


def load_tensorrt():
    """The `tensorrt` module (its Python runtime, from NVIDIA's wheels or a TensorRT-LLM container)."""
    try:
        import tensorrt
    except ImportError as exc:
        raise EngineRefused(f"the TensorRT runtime is not installed ({exc}): docs/tensorrt.md") from None
    return tensorrt


def io_list(engine, trt) -> list[TensorSpec]:
    """The engine's IO tensors as TensorRT's runtime API lists them."""
    names = {trt.DataType.INT32: "int32", trt.DataType.INT64: "int64", trt.DataType.FLOAT: "float32",
             trt.DataType.HALF: "float16", trt.DataType.BF16: "bfloat16"}
    specs = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        dtype = engine.get_tensor_dtype(name)
        specs.append(TensorSpec(name, engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT,
                                names.get(dtype, str(dtype)), tuple(engine.get_tensor_shape(name)),
                                engine.get_tensor_location(name) == trt.TensorLocation.HOST))
    return specs


class TrtRunner:
    def __init__(self, cfg: MossSpeechConfig, engine_dir: str | Path, num_blocks: int, block_size: int,
                 device: torch.device, max_num_seqs: int, max_model_len: int, max_num_batched_tokens: int, trt=None):
        """cfg: the model's, which the engine's must match; the limits: the scheduler's, which the engine's build must
        hold (EngineRefused otherwise, naming the setting). trt: the `tensorrt` module (default: imported)."""
        engine_dir = Path(engine_dir)
        self.cfg, self.device, self.block_size = cfg, device, block_size
        build = self._check_engine_dir(engine_dir, cfg, block_size, max_num_seqs, max_model_len, max_num_batched_tokens)
        self.max_tokens, self.max_batch = build["max_num_tokens"], build["max_batch_size"]
        self.window = build["max_seq_len"]
        self.max_blocks = -(-self.window // block_size)
        trt = trt or load_tensorrt()
        engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(
            (engine_dir / ENGINE_FILE).read_bytes())
        if engine is None:
            raise EngineRefused(f"{engine_dir / ENGINE_FILE}: TensorRT could not deserialize it (another TensorRT "
                                "version, or another GPU)")
        try:
            self.io: EngineIO = understand(io_list(engine, trt))
        except EngineRefused as exc:
            raise EngineRefused(f"{engine_dir / ENGINE_FILE}: {exc}") from None
        self.engine, self.context = engine, engine.create_execution_context()
        if self.context is None:
            raise EngineRefused(f"{engine_dir / ENGINE_FILE}: no execution context (out of device memory?)")
        dtype = TORCH_DTYPES[self.kv_dtype]
        self.kv_cache = torch.zeros(num_blocks, cfg.num_layers, 2, cfg.num_key_value_heads, block_size, cfg.head_dim,
                                    dtype=dtype, device=device)
        self.buffers = {name: self._allocate(spec) for name, spec in self.io.tensors.items()}

    # ---- the engine directory -------------------------------------------------------------------
    def _check_engine_dir(self, engine_dir: Path, cfg: MossSpeechConfig, block_size: int, max_num_seqs: int,
                          max_model_len: int, max_num_batched_tokens: int) -> dict:
        """config.json against the model and the scheduler → the engine's build config."""
        if not (engine_dir / ENGINE_FILE).exists():
            raise EngineRefused(f"{engine_dir}: no {ENGINE_FILE} (a TP = PP = 1 engine: trtllm-build's output)")
        try:
            pretrained, engine_cfg = read_config(engine_dir)
        except ValueError as exc:
            raise EngineRefused(str(exc)) from None
        for name in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "num_shared_layers",
                     "num_modality_layers", "vocab_size", "audio_vocab_size"):
            if getattr(engine_cfg, name) != getattr(cfg, name):
                raise EngineRefused(f"{engine_dir}: the engine's {name} is {getattr(engine_cfg, name)}, the model's "
                                    f"{getattr(cfg, name)}")
        build = json.loads((engine_dir / "config.json").read_text()).get("build_config")
        if not build:
            raise EngineRefused(f"{engine_dir}: config.json has no build_config (not an engine directory?)")
        plugins = build.get("plugin_config", {})
        # paged context FMHA: context requests after cached positions (session turns, prefix hits, chunked prefill)
        wants = {"paged_kv_cache": True, "remove_input_padding": True, "use_paged_context_fmha": True}
        for name, value in wants.items():
            if plugins.get(name) != value:
                raise EngineRefused(f"{engine_dir}: built with {name}={plugins.get(name)}; this runner needs {value} "
                                    "(docs/tensorrt.md)")
        if plugins.get("tokens_per_block") != block_size:
            raise EngineRefused(f"{engine_dir}: tokens_per_block is {plugins.get('tokens_per_block')}; the llm's "
                                f"--block-size is {block_size}: build with --tokens_per_block {block_size}")
        for name, ours, flag in (("max_batch_size", max_num_seqs, "--max-num-seqs"),
                                 ("max_num_tokens", max_num_batched_tokens, "--max-num-batched-tokens"),
                                 ("max_seq_len", max_model_len, "--max-model-len")):
            if (build.get(name) or 0) < ours:
                raise EngineRefused(f"{engine_dir}: built with {name} {build.get(name)}, under the llm's {flag} "
                                    f"{ours}: lower {flag} or build with a larger {name}")
        self.kv_dtype = pretrained.get("dtype", "bfloat16")
        if self.kv_dtype not in ("float32", "float16", "bfloat16"):
            raise EngineRefused(f"{engine_dir}: dtype {self.kv_dtype!r}: float32, float16 or bfloat16")
        return build

    def _allocate(self, spec: TensorSpec) -> torch.Tensor:
        """A buffer for the largest step: the engine's static sizes, and our limits where it lets them vary."""
        sizes = {"input_ids": (self.max_tokens,), "audio_input_ids": (self.max_tokens,),
                 "position_ids": (self.max_tokens,), "cache_indirection": (self.max_batch, 1, self.window),
                 "host_max_attention_window_sizes": (self.cfg.num_layers,),
                 "host_kv_cache_pool_mapping": (self.cfg.num_layers,), "host_sink_token_length": (1,),
                 "host_runtime_perf_knobs": (16,), "host_context_progress": (1,),
                 "logits": (self.max_batch, self.cfg.vocab_size),
                 "audio_logits": (self.max_batch, self.cfg.audio_vocab_size)}
        if spec.name.endswith("kv_cache_block_offsets"):
            shape = (1, self.max_batch, 2, self.max_blocks) if len(spec.shape) == 4 else (self.max_batch, 2, self.max_blocks)
        elif spec.name == "host_kv_cache_pool_pointers":
            shape = (1, 2) if len(spec.shape) == 2 else (2,)
        else:
            shape = sizes.get(spec.name, (self.max_batch,))
        # TensorRT-LLM's runtime puts host_* inputs in host memory by their name (trt_io.py)
        on_host = spec.name.startswith("host_") or self.device.type != "cuda"
        return torch.zeros(shape, dtype=TORCH_DTYPES[spec.dtype], device="cpu" if on_host else self.device,
                           pin_memory=on_host and self.device.type == "cuda")

    # ---- the runner contract ----------------------------------------------------------------------
    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """As the torch runner's: each (source, destination) block's K/V, every layer."""
        source, destination = (torch.tensor(ids, device=self.device) for ids in zip(*copies))
        self.kv_cache[destination] = self.kv_cache[source]

    def run(self, batch: ScheduledBatch, feed: tuple[torch.Tensor, torch.Tensor] | None = None
            ) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """As the torch runner's (torch_runner.ModelRunner.run)."""
        seqs, counts = batch.seqs, batch.num_tokens
        # context requests first (the attention plugin's order); `order[k]` is the batch index of the engine's row k
        generation = [feed is not None or (n == 1 and seq.num_cached > 0) for seq, n in zip(seqs, counts)]
        order = [i for i in range(len(seqs)) if not generation[i]] + [i for i in range(len(seqs)) if generation[i]]
        if len(order) > self.max_batch or sum(counts) > self.max_tokens:
            raise Internal(f"a step of {len(order)} requests and {sum(counts)} tokens is over the engine's "
                           f"max_batch_size {self.max_batch} / max_num_tokens {self.max_tokens}")
        views = self._fill(batch, order, generation, feed)
        self._execute(views, len(order))
        text_logits, audio_logits = views["logits"], views["audio_logits"]
        row_of = {i: k for k, i in enumerate(order)}
        sampled, text_rows, audio_rows = [], [], []
        for i, (seq, n) in enumerate(zip(seqs, counts)):
            if seq.num_cached + n == len(seq) or feed is not None:
                sampled.append(i)
                (text_rows if seq.mode is Mode.TEXT else audio_rows).append(row_of[i])
            seq.record_text_kv(seq.num_cached, n, computed=True)  # both branches, always
            seq.num_cached += n
        return sampled, _zero_rows_as_nan(text_logits[text_rows]), _zero_rows_as_nan(audio_logits[audio_rows])

    def _fill(self, batch: ScheduledBatch, order: list[int], generation: list[bool],
              feed: tuple[torch.Tensor, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        """Every IO tensor's view for this step, inputs filled → {name: view}."""
        seqs, counts, L = batch.seqs, batch.num_tokens, self.cfg.num_layers
        b, n_tokens = len(order), sum(counts)
        text, audio, positions = [], [], []
        past = np.zeros(b, np.int32)
        new = np.zeros(b, np.int32)
        offsets = np.zeros((b, 2, self.max_blocks), np.int32)
        for k, i in enumerate(order):
            seq, n = seqs[i], counts[i]
            start = seq.num_cached
            if feed is None:
                text += seq.text_ids[start:start + n]
                audio += seq.audio_ids[start:start + n]
            positions += range(start, start + n)
            past[k], new[k] = start, n
            table = np.asarray(seq.block_table, np.int32)
            offsets[k, 0, :len(table)] = table * 2 * L      # K
            offsets[k, 1, :len(table)] = table * 2 * L + 1  # V
        kinds = np.array([GENERATION if generation[i] else CONTEXT for i in order], np.int32)
        contexts = np.where(kinds == CONTEXT, new, np.array([seqs[i].num_prompt for i in order], np.int32))
        host = {
            "position_ids": np.asarray(positions, np.int32),
            "last_token_ids": np.cumsum(new).astype(np.int32),
            "sequence_length": past + new,
            "context_lengths": contexts, "host_context_lengths": contexts,
            # TensorRT-LLM's runtime: a context request's positions after this step (its cached ones are
            # sequence_length - context_lengths), a generation request's before it
            "host_past_key_value_lengths": np.where(kinds == CONTEXT, past + new, past).astype(np.int32),
            "host_request_types": kinds,
            "host_max_attention_window_sizes": np.full(L, self.window, np.int32),
            "host_sink_token_length": np.zeros(1, np.int32),
            "host_runtime_perf_knobs": np.full(16, -1, np.int64),
            "host_context_progress": np.zeros(1, np.int64),
            "host_kv_cache_pool_mapping": np.zeros(L, np.int32),
        }
        pools_axis = self.io.variant.pools_axis
        for name in ("kv_cache_block_offsets", "host_kv_cache_block_offsets"):
            host[name] = offsets[None] if pools_axis else offsets
        pointers = np.array([self.kv_cache.data_ptr(), 0], np.int64)
        host["host_kv_cache_pool_pointers"] = pointers[None] if pools_axis else pointers
        if feed is None:
            host["input_ids"], host["audio_input_ids"] = np.asarray(text, np.int32), np.asarray(audio, np.int32)
        views = {}
        for name, spec in self.io.tensors.items():
            buffer = self.buffers[name]
            if not spec.is_input:
                views[name] = buffer[:b]
                # A NaN where the engine writes every row's first logit: a step that did not run leaves it, and the
                # sampler fails each request whose logits are not finite (no device → host read here).
                views[name][:, 0] = float("nan")
            elif name == "cache_indirection":  # zeros since allocation (beam width 1): nobody writes it
                views[name] = _prefix(buffer, (b, 1, self.window))
            elif name in host:
                value = torch.from_numpy(host[name])
                views[name] = _prefix(buffer, value.shape)
                views[name].copy_(value, non_blocking=True)
            else:  # the ids of a step launched ahead: the previous step's samples, on the device already
                views[name] = buffer[:n_tokens]
        if feed is not None:
            rows = torch.tensor(order, device=feed[0].device)
            views["input_ids"].copy_(feed[0][rows].to(torch.int32))
            views["audio_input_ids"].copy_(feed[1][rows].to(torch.int32))
        return views

    def _execute(self, views: dict[str, torch.Tensor], b: int) -> None:
        """Bind every IO tensor, run the engine, check what it returned."""
        ctx = self.context
        for name, view in views.items():
            spec = self.io.tensors[name]
            if spec.is_input and not ctx.set_input_shape(name, tuple(view.shape)):
                raise Internal(f"engine: input {name} refused shape {tuple(view.shape)} (outside the engine's profile)")
            if not ctx.set_tensor_address(name, view.data_ptr()):
                raise Internal(f"engine: {name} refused its address")
        if missing := ctx.infer_shapes():
            raise Internal(f"engine: shapes not known for {list(missing)}")
        for name in ("logits", "audio_logits"):
            if tuple(ctx.get_tensor_shape(name)) != tuple(views[name].shape):
                raise Internal(f"engine: {name} would be {tuple(ctx.get_tensor_shape(name))}, not "
                               f"{tuple(views[name].shape)}")
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0
        if not ctx.execute_async_v3(stream):
            raise Internal("engine: execute_async_v3 failed (see TensorRT's log)")


def _zero_rows_as_nan(logits: torch.Tensor) -> torch.Tensor:
    """Sampled rows [R, V] the engine left all zero (it ran, and wrote nothing there) get a NaN, so the sampler fails
    those requests alone, as it does one not finite: on the device, no host read."""
    logits[:, 0].masked_fill_(logits.eq(0).all(dim=1), float("nan"))
    return logits


def _prefix(buffer: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The contiguous view of `shape` at the start of `buffer` (the step's leading sizes are at most the buffer's)."""
    return buffer.reshape(-1)[:int(np.prod(shape))].view(shape)
