"""A fake of the part of TensorRT's Python runtime that the TRT runner uses (services/llm/runner/trt_runner.py), for
an engine of the dual-head model as TensorRT-LLM builds it: it declares the IO list of a real engine of each release
(0.13, 0.14, 0.15+), and it computes the model from the bound buffers alone. It reads every input through the address
bound to it, and the K/V through the pool pointer and the block offsets as the attention plugin addresses them
(block offset + 2 · layer, then [kv_heads, tokens_per_block, head_dim]), writes the new K/V there, and writes both
logits to the outputs' addresses. The layers are the model's own (services/llm/model), filled from the TensorRT-LLM
checkpoint the engine was "built" from (trtllm_checkpoint.py).

Stricter than TensorRT, on purpose: every IO tensor's shape and address must be set again for every step (an address
left from an earlier step is stale: the buffer behind it may be gone), and the inputs must agree with one another as
the plugin assumes (context requests first, one token per generation request, lengths that add up). A step that
breaks a rule is not run: execute_async_v3 returns False and `last_error` says why.

On CPU "device" memory is host memory, so an address is a pointer this process can read (ctypes).
"""

from __future__ import annotations

import ctypes
import enum
import json
from pathlib import Path

import numpy as np
import torch

from services.llm.model.model import causal_attention
from services.llm.model.trtllm_checkpoint import load_model, read_config


class DataType(enum.Enum):
    INT32 = 0
    INT64 = 1
    FLOAT = 2
    HALF = 3
    BF16 = 4


class TensorIOMode(enum.Enum):
    INPUT = 0
    OUTPUT = 1


class TensorLocation(enum.Enum):
    DEVICE = 0
    HOST = 1


class Logger:
    WARNING = 2

    def __init__(self, level=None):
        self.level = level


TORCH = {DataType.INT32: torch.int32, DataType.INT64: torch.int64, DataType.FLOAT: torch.float32,
         DataType.HALF: torch.float16, DataType.BF16: torch.bfloat16}
BY_NAME = {"int32": DataType.INT32, "int64": DataType.INT64, "float32": DataType.FLOAT, "float16": DataType.HALF,
           "bfloat16": DataType.BF16}


def io_list(variant: str, layers: int, text_vocab: int, audio_vocab: int, logits_dtype: str) -> dict:
    """name → (input?, dtype, shape with -1 where it varies, on host?) of a dual-head engine of that release."""
    i32, i64 = DataType.INT32, DataType.INT64
    io = {
        "input_ids": (True, i32, (-1,), False),
        "audio_input_ids": (True, i32, (-1,), False),
        "position_ids": (True, i32, (-1,), False),
        "last_token_ids": (True, i32, (-1,), False),
        "sequence_length": (True, i32, (-1,), False),
        "context_lengths": (True, i32, (-1,), False),
        "host_context_lengths": (True, i32, (-1,), True),
        "host_past_key_value_lengths": (True, i32, (-1,), True),
        "host_request_types": (True, i32, (-1,), True),
        "host_max_attention_window_sizes": (True, i32, (layers,), True),
        "host_sink_token_length": (True, i32, (1,), True),
        "cache_indirection": (True, i32, (-1, 1, -1), False),
        "host_runtime_perf_knobs": (True, i64, (16,), True),
    }
    if variant == "0.13":
        io["kv_cache_block_offsets"] = (True, i32, (-1, 2, -1), False)
        io["host_kv_cache_block_offsets"] = (True, i32, (-1, 2, -1), True)
        io["host_kv_cache_pool_pointers"] = (True, i64, (2,), True)
    else:
        io["kv_cache_block_offsets"] = (True, i32, (1, -1, 2, -1), False)
        io["host_kv_cache_block_offsets"] = (True, i32, (1, -1, 2, -1), True)
        io["host_kv_cache_pool_pointers"] = (True, i64, (1, 2), True)
        io["host_kv_cache_pool_mapping"] = (True, i32, (layers,), True)
    if variant == "0.15+":
        io["host_context_progress"] = (True, i64, (1,), True)
    io["logits"] = (False, BY_NAME[logits_dtype], (-1, text_vocab), False)
    io["audio_logits"] = (False, BY_NAME[logits_dtype], (-1, audio_vocab), False)
    return io


def build(engine_dir: Path, checkpoint_dir: Path, variant: str = "0.14", tokens_per_block: int = 16,
          max_batch_size: int = 16, max_num_tokens: int = 512, max_seq_len: int = 1024, io_changes: dict | None = None,
          plugin_changes: dict | None = None) -> Path:
    """An engine directory as trtllm-build writes it (config.json, rank0.engine), its engine the fake's: the
    checkpoint's weights and the release's IO list, changed by io_changes (name → spec, or None to drop it)."""
    engine_dir.mkdir(parents=True, exist_ok=True)
    pretrained = json.loads((checkpoint_dir / "config.json").read_text())
    plugins = {"gpt_attention_plugin": pretrained["dtype"], "paged_kv_cache": True, "remove_input_padding": True,
               "context_fmha": True, "use_paged_context_fmha": True, "tokens_per_block": tokens_per_block,
               **(plugin_changes or {})}
    config = {"version": {"0.13": "0.13.0", "0.14": "0.14.0", "0.15+": "0.16.0"}[variant],
              "pretrained_config": pretrained,
              "build_config": {"max_batch_size": max_batch_size, "max_num_tokens": max_num_tokens,
                               "max_seq_len": max_seq_len, "plugin_config": plugins}}
    (engine_dir / "config.json").write_text(json.dumps(config, indent=2))
    changes = {name: None if spec is None else [spec[0], spec[1].name, list(spec[2]), spec[3]]
               for name, spec in (io_changes or {}).items()}
    (engine_dir / "rank0.engine").write_text(json.dumps({"fake_engine": variant, "checkpoint": str(checkpoint_dir),
                                                         "tokens_per_block": tokens_per_block, "io_changes": changes}))
    return engine_dir


class Runtime:
    def __init__(self, logger: Logger):
        self.logger = logger

    def deserialize_cuda_engine(self, data: bytes):
        try:
            spec = json.loads(data)
            variant, checkpoint = spec["fake_engine"], Path(spec["checkpoint"])
        except (ValueError, KeyError, TypeError):
            return None  # as TensorRT: not an engine it can read
        return Engine(variant, checkpoint, spec["tokens_per_block"], spec.get("io_changes") or {})


class Engine:
    def __init__(self, variant: str, checkpoint: Path, tokens_per_block: int, io_changes: dict):
        self.tokens_per_block = tokens_per_block
        pretrained, cfg = read_config(checkpoint)
        self.cfg, self.model = cfg, load_model(checkpoint)
        self.io = io_list(variant, cfg.num_layers, cfg.vocab_size, cfg.audio_vocab_size, pretrained["dtype"])
        for name, spec in io_changes.items():
            if spec is None:
                self.io.pop(name, None)
            else:
                self.io[name] = (spec[0], DataType[spec[1]], tuple(spec[2]), spec[3])
        self.names = list(self.io)

    @property
    def num_io_tensors(self) -> int:
        return len(self.names)

    def get_tensor_name(self, i: int) -> str:
        return self.names[i]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return TensorIOMode.INPUT if self.io[name][0] else TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name: str) -> DataType:
        return self.io[name][1]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.io[name][2]

    def get_tensor_location(self, name: str) -> TensorLocation:
        return TensorLocation.HOST if self.io[name][3] else TensorLocation.DEVICE

    def create_execution_context(self):
        return Context(self)


def memory(address: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """The tensor of `shape` at `address` (this process's memory), shared, not copied."""
    count = int(np.prod(shape))
    raw = (ctypes.c_byte * (count * torch.empty(0, dtype=dtype).element_size())).from_address(address)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).view(shape) if count else torch.empty(shape, dtype=dtype)


class StepRefused(Exception):
    pass


class Context:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.last_error = ""
        self.steps = 0

    def set_input_shape(self, name: str, shape) -> bool:
        spec = self.engine.io.get(name)
        shape = tuple(int(s) for s in shape)
        if spec is None or not spec[0] or len(shape) != len(spec[2]):
            return False
        if any(want not in (-1, got) for want, got in zip(spec[2], shape)):
            return False
        self.shapes[name] = shape
        return True

    def set_tensor_address(self, name: str, address: int) -> bool:
        if name not in self.engine.io:
            return False
        self.addresses[name] = int(address)
        return True

    def infer_shapes(self) -> list[str]:
        return [name for name, spec in self.engine.io.items() if spec[0] and name not in self.shapes]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        spec = self.engine.io[name]
        if spec[0]:
            return self.shapes.get(name, spec[2])
        batch = self.shapes.get("last_token_ids", (-1,))[0]
        return (batch, spec[2][1])

    def execute_async_v3(self, stream: int) -> bool:
        try:
            self._step()
            return True
        except StepRefused as exc:
            self.last_error = str(exc)
            return False
        finally:  # every binding is for one step only (see the module's docstring)
            self.shapes, self.addresses = {}, {}

    # ---- the step, from the bound buffers ------------------------------------------------------------
    def _read(self, name: str) -> torch.Tensor:
        if name not in self.addresses:
            raise StepRefused(f"{name}: no address set for this step")
        shape = self.shapes.get(name) if self.engine.io[name][0] else self.get_tensor_shape(name)
        if shape is None:
            raise StepRefused(f"{name}: no shape set for this step")
        return memory(self.addresses[name], TORCH[self.engine.io[name][1]], shape)

    def _step(self) -> None:
        io, cfg = self.engine.io, self.engine.cfg
        for name in io:
            if name not in self.addresses or io[name][0] and name not in self.shapes:
                raise StepRefused(f"{name}: not bound for this step")
        get = {name: self._read(name) for name in io}
        last = get["last_token_ids"].long()
        tokens = torch.diff(last, prepend=last.new_zeros(1))
        kinds = get["host_request_types"].long()
        # the positions cached before this step, as TensorRT-LLM's runtime gives them: a context request's
        # host_past_key_value_lengths is its length after the step, a generation request's the length before
        total = get["sequence_length"].long()
        past = total - tokens
        host_past = get["host_past_key_value_lengths"].long()
        expect(torch.equal(host_past, torch.where(kinds == 0, total, total - 1)),
               "host_past_key_value_lengths: not sequence_length (context) or sequence_length - 1 (generation)")
        b, n = len(last), int(last[-1]) if len(last) else 0
        expect(get["input_ids"].shape == (n,) and get["audio_input_ids"].shape == (n,), "ids: not last_token_ids[-1]")
        expect(get["position_ids"].shape == (n,), "position_ids: not last_token_ids[-1]")
        expect(bool((tokens > 0).all()), "last_token_ids: not increasing")
        expect(bool((kinds[1:] >= kinds[:-1]).all()), "host_request_types: a context request after a generation one")
        expect(bool((tokens[kinds == 1] == 1).all()), "a generation request with more than one token")
        ctx_lens = get["context_lengths"].long()
        expect(torch.equal(ctx_lens, get["host_context_lengths"].long()), "context_lengths != host_context_lengths")
        expect(torch.equal(ctx_lens[kinds == 0], tokens[kinds == 0]), "a context request's context_lengths")
        expect(torch.equal(get["kv_cache_block_offsets"], get["host_kv_cache_block_offsets"]),
               "device and host block offsets differ")
        expect(bool((get["host_max_attention_window_sizes"].long() >= (past + tokens).max()).all()),
               "the attention window is shorter than a sequence")
        expect(int(get["host_sink_token_length"][0]) == 0, "host_sink_token_length")
        expect(get["cache_indirection"].shape[0] == b and not bool(get["cache_indirection"].any()), "cache_indirection")
        expect(bool((get["host_runtime_perf_knobs"] == -1).all()), "host_runtime_perf_knobs")
        if "host_kv_cache_pool_mapping" in get:
            expect(not bool(get["host_kv_cache_pool_mapping"].any()), "a layer outside pool 0")
        if "host_context_progress" in get:
            expect(int(get["host_context_progress"][0]) == 0, "host_context_progress")
        offsets = get["kv_cache_block_offsets"].reshape(b, 2, -1).long()
        pointers = get["host_kv_cache_pool_pointers"].reshape(-1)
        expect(int(pointers[1]) == 0, "a secondary pool pointer")
        positions = get["position_ids"].long()
        starts = last - tokens
        for r in range(b):
            expect(torch.equal(positions[starts[r]:last[r]], torch.arange(int(past[r]), int(past[r] + tokens[r]))),
                   "position_ids: not past .. past + tokens")
        dtype = next(self.engine.model.parameters()).dtype
        block_elems = cfg.num_key_value_heads * self.engine.tokens_per_block * cfg.head_dim
        used = int(offsets.max()) + 2 * cfg.num_layers if b else 1
        pool = memory(int(pointers[0]), dtype, (used * block_elems,)).view(used, cfg.num_key_value_heads, -1,
                                                                          cfg.head_dim)
        attention = PluginAttention(pool, offsets, starts, tokens, past)
        with torch.no_grad():
            text_logits, audio_logits = self.engine.model(
                get["input_ids"].long(), get["audio_input_ids"].long(), positions, attention,
                text_rows=last - 1, audio_rows=last - 1)
        get["logits"].copy_(text_logits)
        get["audio_logits"].copy_(audio_logits)
        self.steps += 1


def expect(ok: bool, problem: str) -> None:
    if not ok:
        raise StepRefused(problem)


class PluginAttention:
    """The model's attention backend, addressing K/V as the GPT attention plugin does: position p of request r, layer
    l, K (field 0) or V (1) is at pool block offsets[r, field, p // tokens_per_block] + 2·l, row p % tokens_per_block."""

    def __init__(self, pool, offsets, starts, tokens, past):
        self.pool, self.offsets, self.starts, self.tokens, self.past = pool, offsets, starts, tokens, past
        self.block = pool.shape[2]

    def _where(self, r: int, field: int, layer: int, positions: torch.Tensor):
        return self.offsets[r, field, positions // self.block] + 2 * layer, positions % self.block

    def attend(self, layer, q, k, v):
        """q [N, heads, d], k/v [N, kv_heads, d] → [N, heads, d]."""
        out = torch.empty_like(q)
        for r in range(len(self.starts)):
            rows = slice(int(self.starts[r]), int(self.starts[r] + self.tokens[r]))
            past, end = int(self.past[r]), int(self.past[r] + self.tokens[r])
            new = torch.arange(past, end)
            for field, values in ((0, k), (1, v)):
                blocks, slots = self._where(r, field, layer, new)
                self.pool[blocks, :, slots] = values[rows].to(self.pool.dtype)
            every = torch.arange(end)
            kb, ks = self._where(r, 0, layer, every)
            vb, vs = self._where(r, 1, layer, every)
            k_all, v_all = self.pool[kb, :, ks], self.pool[vb, :, vs]  # [end, kv_heads, d]
            out[rows] = causal_attention(q[rows], k_all.to(q.dtype), v_all.to(q.dtype), start=past)
        return out
