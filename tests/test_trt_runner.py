"""The TensorRT-LLM runner against a fake TensorRT runtime (tests/fake_tensorrt.py: a dual-head engine of each
release's IO list, computing the model from the bound buffers alone): the HF → TensorRT-LLM checkpoint conversion,
greedy generation through the whole engine equal to the torch runner's (multi-turn sessions, prefix hits,
preemption) with every layer's K/V where the torch runner puts it, engines refused by their IO list or build, and
every binding fault failing its step. No TensorRT is needed (none can be installed where this is developed)."""

from __future__ import annotations

import json

import fake_tensorrt
import pytest
import torch
from safetensors.torch import load_file, save_file
from sessions import Sessions

from services.common.errors import Internal
from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.engine.engine import EngineConfig, GenerationRequest, LLMEngine
from services.llm.model import trtllm_checkpoint
from services.llm.model.checkpoint import CheckpointError, random_model, save_pretrained
from services.llm.model.config import tiny_config
from services.llm.model.tokenizer import tiny_tokenizer
from services.llm.model.trtllm_checkpoint import convert, load_model, to_trtllm, trtllm_names
from services.llm.runner import trt_runner
from services.llm.runner.trt_io import EngineRefused

CFG = tiny_config()
REAL_LOAD_TENSORRT = trt_runner.load_tensorrt
GREEDY = SamplingSettings(temperature=0.0, repetition_penalty=1.0, max_new_tokens=20, min_new_tokens=0)
BLOCK = 16


@pytest.fixture(scope="module")
def model():
    return random_model(CFG, seed=3)


@pytest.fixture(scope="module")
def checkpoint(model, tmp_path_factory):
    """The model as an HF checkpoint, and converted: → (HF dir, TensorRT-LLM dir)."""
    hf, trt = tmp_path_factory.mktemp("hf"), tmp_path_factory.mktemp("trtllm")
    save_pretrained(model, hf)
    convert(hf, trt)
    return hf, trt


@pytest.fixture(autouse=True)
def fake_runtime(monkeypatch):
    monkeypatch.setattr(trt_runner, "load_tensorrt", lambda: fake_tensorrt)


def engine_dir(checkpoint, tmp_path, variant="0.14", **kw):
    return fake_tensorrt.build(tmp_path / f"engine-{variant}", checkpoint[1], variant, tokens_per_block=BLOCK, **kw)


def make_engine(model, runner: str, directory=None, **kw) -> LLMEngine:
    config = {"kv_cache_bytes": 1 << 22, "block_size": BLOCK, "max_num_seqs": 8, "max_num_batched_tokens": 256,
              "max_model_len": 1024, "runner": runner, "engine_dir": str(directory) if directory else None, **kw}
    return LLMEngine(model, tiny_tokenizer(CFG), EngineConfig(**config))


def hello(engine: LLMEngine) -> tuple[list, list[int], list[int]]:
    """One greedy request through the engine → (its chunks, its text ids, its audio ids)."""
    seq = engine.make_sequence(GenerationRequest("r", GREEDY, ChunkSettings(), text="Hello there."))
    engine.add(seq)
    chunks = []
    while engine.has_work():
        chunks += engine.step()
    return chunks, seq.text_ids, seq.audio_ids


# ---- the checkpoint ------------------------------------------------------------------------------
def test_the_conversion_maps_every_official_tensor_and_back(model, checkpoint):
    tensors = load_file(str(checkpoint[1] / "rank0.safetensors"))
    assert sorted(tensors) == sorted(trtllm_names(CFG))
    qkv = tensors["transformer.layers.0.attention.qkv.weight"]
    assert qkv.shape == ((CFG.num_attention_heads + 2 * CFG.num_key_value_heads) * CFG.head_dim, CFG.hidden_size)
    assert torch.equal(tensors["transformer.text_layers.0.mlp.fc.weight"],
                       model.model.text_block.layers[0].mlp.gate_proj.weight)  # TensorRT-LLM's fc is the gate
    config = json.loads((checkpoint[1] / "config.json").read_text())
    assert config["architecture"] == "MossSpeechForCausalLM" and config["num_hidden_layers"] == CFG.num_shared_layers
    back = load_model(checkpoint[1]).state_dict()
    original = model.state_dict()
    assert sorted(back) == sorted(original)
    assert all(torch.equal(back[k], original[k]) for k in original)


@pytest.mark.parametrize("change, says", [
    (lambda state: state.pop("model.audio_norm.weight"), "missing ['model.audio_norm.weight']"),
    (lambda state: state.update({"model.vision_tower.weight": torch.zeros(2)}), "unexpected ['model.vision_tower.weight']"),
    (lambda state: state.update({"text_lm_head.weight": torch.zeros(3, 3)}), "text_lm_head.weight has shape (3, 3)"),
])
def test_a_checkpoint_that_is_not_the_model_is_refused(checkpoint, tmp_path, change, says):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text((checkpoint[0] / "config.json").read_text())
    state = load_file(str(checkpoint[0] / "model.safetensors"))
    change(state)
    save_file(state, str(hf / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        convert(hf, tmp_path / "out")
    assert says in str(err.value)


def test_a_tensor_without_a_name_there_is_refused(model):
    state = dict(model.state_dict(), **{"model.extra.weight": torch.zeros(1)})
    with pytest.raises(CheckpointError, match="no TensorRT-LLM name: \\['model.extra.weight'\\]"):
        to_trtllm(state, CFG)


# ---- generation through the whole engine ------------------------------------------------------------
def conversation(engine: LLMEngine) -> list[tuple[list[int], list[int]]]:
    """Two sessions of two turns each (the second turns reuse their sessions' blocks: prefix hits), and two
    one-off requests beside them, in a pool too small for all at once (preemptions) → every turn's tokens."""
    sessions, done = Sessions(), []
    for turn in range(2):
        seqs = [sessions.add(engine, sessions.request(f"s{s}-{turn}", GREEDY, f"session-{s}",
                                                      text=f"Hi {turn}{s}."))
                for s in range(2)]
        seqs += [sessions.add(engine, GenerationRequest(f"x{turn}-{i}", GREEDY, seqs[0].chunking,
                                                        text="Beside. " * (1 + i))) for i in range(2)]
        sessions.run(engine)
        done += [(seq.text_ids, seq.audio_ids) for seq in seqs]
    sessions.release_all(engine)
    return done


def test_greedy_generation_matches_the_torch_runner(model, checkpoint, tmp_path, variant="0.14"):
    directory = engine_dir(checkpoint, tmp_path, variant)
    small = {"kv_cache_bytes": 16 * BLOCK * CFG.kv_bytes_per_token}  # 16 blocks: not all four requests at once
    reference, trt = make_engine(model, "reference", **small), make_engine(model, "trt", directory, **small)
    assert isinstance(trt.runner, trt_runner.TrtRunner) and trt.runner.io.variant.name == variant
    want, got = conversation(reference), conversation(trt)
    assert got == want
    assert trt.scheduler.num_preemptions > 0 and trt.scheduler.num_preemptions == reference.scheduler.num_preemptions
    assert trt.block_manager.hit_tokens > 0
    assert trt.runner.context.steps > 0
    # every layer's K/V where the torch runner put it: the fake wrote them through the pool pointer and block offsets
    assert torch.allclose(trt.runner.kv_cache, reference.runner.kv_cache, atol=1e-5)
    assert trt.block_manager.num_used == 0


@pytest.mark.parametrize("variant", ["0.13", "0.15+"])
def test_every_release_s_io_gives_the_same_tokens_and_kv(model, checkpoint, tmp_path, variant):
    """The other releases' IO lists (block offsets without the pools axis, one pool pointer; context progress): a
    request through each, against the torch runner."""
    reference, trt = make_engine(model, "reference"), make_engine(model, "trt", engine_dir(checkpoint, tmp_path, variant))
    assert trt.runner.io.variant.name == variant
    assert hello(trt)[1:] == hello(reference)[1:]
    assert torch.allclose(trt.runner.kv_cache, reference.runner.kv_cache, atol=1e-5)


# ---- engines refused ------------------------------------------------------------------------------
I32, I64 = fake_tensorrt.DataType.INT32, fake_tensorrt.DataType.INT64


@pytest.mark.parametrize("io_changes, says", [
    ({"host_request_types": None}, "missing ['host_request_types']"),
    ({"lora_ranks": (True, I32, (-1,), True)}, "unknown ['lora_ranks']"),
    ({"hidden_states": (False, fake_tensorrt.DataType.FLOAT, (-1, 64), False)}, "its outputs are"),
    ({"input_ids": (True, I64, (-1,), False)}, "input input_ids is int64"),
    ({"kv_cache_block_offsets": (True, I32, (-1, 2, -1), False)},
     "kv_cache_block_offsets is int32 of rank 3; TensorRT-LLM 0.14 has int32 of rank 4"),
])
def test_an_engine_whose_io_list_is_not_understood_is_refused(model, checkpoint, tmp_path, io_changes, says):
    directory = engine_dir(checkpoint, tmp_path, io_changes=io_changes)
    with pytest.raises(EngineRefused) as err:
        make_engine(model, "trt", directory)
    assert says in str(err.value) and "rank0.engine" in str(err.value)


@pytest.mark.parametrize("build, says", [
    ({"plugin_changes": {"tokens_per_block": 32}}, "tokens_per_block is 32; the llm's --block-size is 16"),
    ({"plugin_changes": {"paged_kv_cache": False}}, "built with paged_kv_cache=False"),
    ({"plugin_changes": {"use_paged_context_fmha": False}}, "built with use_paged_context_fmha=False"),
    ({"max_batch_size": 4}, "max_batch_size 4, under the llm's --max-num-seqs 8"),
    ({"max_seq_len": 512}, "max_seq_len 512, under the llm's --max-model-len 1024"),
])
def test_an_engine_built_for_other_limits_is_refused(model, checkpoint, tmp_path, build, says):
    with pytest.raises(EngineRefused, match=says.replace("(", "\\(")):
        make_engine(model, "trt", engine_dir(checkpoint, tmp_path, **build))


def test_an_engine_file_tensorrt_cannot_read_is_refused(model, checkpoint, tmp_path):
    directory = engine_dir(checkpoint, tmp_path)
    (directory / "rank0.engine").write_bytes(b"\x00not an engine")
    with pytest.raises(EngineRefused, match="could not deserialize"):
        make_engine(model, "trt", directory)
    with pytest.raises(ValueError, match="needs an engine directory"):
        make_engine(model, "trt")


# ---- binding faults ---------------------------------------------------------------------------------
def faulty(engine: LLMEngine, fault):
    """Wrap the runner's execution context so that `fault(method, step, name, value)` → what to do with each
    set_input_shape / set_tensor_address call (the value to pass, or None to skip the call)."""
    ctx, steps = engine.runner.context, [0]
    real = {"set_input_shape": ctx.set_input_shape, "set_tensor_address": ctx.set_tensor_address}
    execute = ctx.execute_async_v3

    def wrap(method):
        def call(name, value):
            value = fault(method, steps[0], name, value)
            return True if value is None else real[method](name, value)
        return call

    def count(stream):
        steps[0] += 1
        return execute(stream)

    ctx.set_input_shape, ctx.set_tensor_address, ctx.execute_async_v3 = wrap("set_input_shape"), \
        wrap("set_tensor_address"), count


@pytest.mark.parametrize("fault, says, refused", [
    (lambda method, step, name, value: None if name == "host_past_key_value_lengths" and method == "set_tensor_address"
     else value, "execute_async_v3 failed", "host_past_key_value_lengths: not bound"),   # an address never set
    (lambda method, step, name, value: value + 8 if name == "host_past_key_value_lengths" and method ==
     "set_tensor_address" else value, "execute_async_v3 failed", "host_past_key_value_lengths: not sequence_length"),
    # an address off by two values: the step reads the wrong numbers
    (lambda method, step, name, value: None if step > 0 and name == "kv_cache_block_offsets"
     and method == "set_tensor_address" else value,
     "execute_async_v3 failed", "kv_cache_block_offsets: not bound"),                    # the first step's, kept
    (lambda method, step, name, value: (value[0] + 1,) if name == "position_ids" and method == "set_input_shape"
     else value, "execute_async_v3 failed", "position_ids: not last_token_ids[-1]"),     # a wrong shape
    (lambda method, step, name, value: None if name == "cache_indirection" and method == "set_input_shape" else value,
     "shapes not known for ['cache_indirection']", ""),                                  # a shape never set
])
def test_a_binding_fault_fails_the_step(model, checkpoint, tmp_path, fault, says, refused):
    engine = make_engine(model, "trt", engine_dir(checkpoint, tmp_path))
    faulty(engine, fault)
    with pytest.raises(Internal, match=says.replace("[", "\\[")):
        hello(engine)
    assert refused in engine.runner.context.last_error


def test_a_stale_pool_address_is_caught_by_the_kv(model, checkpoint, tmp_path):
    """The pool pointer of another buffer (as if the pool had moved): generation may even agree with itself, but
    the K/V are not in the runner's pool, where the torch runner's are."""
    reference, trt = make_engine(model, "reference"), make_engine(model, "trt", engine_dir(checkpoint, tmp_path))
    elsewhere = torch.zeros_like(trt.runner.kv_cache)
    fill = trt.runner._fill

    def moved(*args):
        views = fill(*args)
        views["host_kv_cache_pool_pointers"].view(-1)[0] = elsewhere.data_ptr()
        return views

    trt.runner._fill = moved
    hello(reference), hello(trt)
    assert elsewhere.any() and not trt.runner.kv_cache.any()
    assert not torch.allclose(trt.runner.kv_cache, reference.runner.kv_cache)


def test_an_engine_that_writes_no_logits_fails_its_requests(model, checkpoint, tmp_path, monkeypatch):
    """A step that returned True but computed nothing leaves the NaN the runner put in each row's first logit: every
    request of it fails as not finite, the engine goes on."""
    engine = make_engine(model, "trt", engine_dir(checkpoint, tmp_path))
    monkeypatch.setattr(fake_tensorrt.Context, "_step", lambda self: None)  # returns True, computes nothing
    chunks = hello(engine)[0]
    assert chunks[-1].final and "not finite" in chunks[-1].error
    assert engine.block_manager.num_used == 0


def test_an_engine_that_writes_zeros_for_a_request_fails_that_request_alone(model, checkpoint, tmp_path, monkeypatch):
    """A step that ran but left one request's logits all zero (its first step, the last row): that request fails,
    the one beside it goes on to its end, and nothing is held."""
    engine = make_engine(model, "trt", engine_dir(checkpoint, tmp_path))
    computed = fake_tensorrt.Context._step

    def zeros_in_the_first_steps_last_row(self):
        first = self.steps == 0
        computed(self)
        if first:
            self._read("logits")[-1].zero_()
            self._read("audio_logits")[-1].zero_()

    monkeypatch.setattr(fake_tensorrt.Context, "_step", zeros_in_the_first_steps_last_row)
    seqs = [engine.make_sequence(GenerationRequest(f"r{i}", GREEDY, ChunkSettings(), text="Hello there."))
            for i in range(2)]
    for seq in seqs:
        engine.add(seq)
    finals = {}
    while engine.has_work():
        finals.update({c.request_id: c for c in engine.step() if c.final})
    assert "not finite" in (finals["r1"].error or "") and not finals["r0"].error
    assert len(seqs[0].audio_ids) > 0 and engine.block_manager.num_used == 0


# ---- the llm service on it ------------------------------------------------------------------------
def test_the_llm_service_builds_on_the_engine_directory(model, checkpoint, tmp_path):
    """`moss-serve llm --runner trt --engine-dir DIR`: the model's config from the engine directory, no weights in
    torch, the tokenizer beside the engine; it speaks as the torch runner does."""
    from services.llm.server import build_engine
    from services.llm.settings import LlmSettings

    directory = engine_dir(checkpoint, tmp_path)
    tiny_tokenizer(CFG).save(str(directory / "tokenizer.json"))
    llm = build_engine(LlmSettings(runner="trt", engine_dir=str(directory), kv_cache_gb=1 / 256, block_size=BLOCK,
                                   max_num_seqs=8, max_num_batched_tokens=256, max_model_len=1024))
    assert isinstance(llm.runner, trt_runner.TrtRunner)
    reference = make_engine(model, "reference")
    assert hello(llm)[1:] == hello(reference)[1:]
    (directory / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="no tokenizer.json"):
        build_engine(LlmSettings(runner="trt", engine_dir=str(directory)))


def test_without_tensorrt_the_llm_refuses_to_start_saying_so(checkpoint, tmp_path, monkeypatch):
    """The real import, and no TensorRT here: an EngineRefused (a ValueError: `moss-serve llm` prints it as its one
    "cannot start" line, services/cli.py)."""
    from services.llm.server import build_engine
    from services.llm.settings import LlmSettings

    monkeypatch.setattr(trt_runner, "load_tensorrt", REAL_LOAD_TENSORRT)
    directory = engine_dir(checkpoint, tmp_path)
    tiny_tokenizer(CFG).save(str(directory / "tokenizer.json"))
    with pytest.raises(EngineRefused) as err:
        build_engine(LlmSettings(runner="trt", engine_dir=str(directory), block_size=BLOCK, max_num_seqs=8,
                                 max_num_batched_tokens=256, max_model_len=1024))
    assert isinstance(err.value, ValueError)
    assert str(err.value) == "the TensorRT runtime is not installed (No module named 'tensorrt'): docs/tensorrt.md"


def test_the_conversion_runs_from_the_command_line(checkpoint, tmp_path, capsys):
    out = tmp_path / "trtllm"
    assert trtllm_checkpoint.main([str(checkpoint[0]), str(out)]) == 0
    assert sorted(load_file(str(out / "rank0.safetensors"))) == sorted(trtllm_names(CFG))
    assert trtllm_checkpoint.main([str(tmp_path / "none"), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cannot convert: ") and "config.json not found" in err


def test_the_engines_layers_index_the_pool_as_the_torch_model_does(model):
    """trtllm_model.py gives each TensorRT-LLM layer stack these KV-pool layers: the torch model's Blocks' own."""
    plan = trtllm_checkpoint.kv_layer_plan(CFG.num_shared_layers, CFG.num_modality_layers, CFG.num_modality_layers)
    for block, stack in trtllm_checkpoint.BRANCHES:
        torch_block = getattr(model.model, block)
        assert plan[stack] == range(torch_block.first_layer, torch_block.first_layer + len(torch_block.layers))
    assert sorted(i for layers in plan.values() for i in layers) == list(range(CFG.num_layers))


def test_the_engine_build_says_what_it_lacks_before_building(checkpoint, tmp_path, capsys):
    """python -m services.llm.model.trtllm_build: not a checkpoint, or no TensorRT-LLM (here), is one line and exit 2;
    nothing is written."""
    from services.llm.model import trtllm_build

    out = tmp_path / "engine"
    assert trtllm_build.main([str(tmp_path / "none"), str(out)]) == 2
    assert trtllm_build.main([str(checkpoint[1]), str(out)]) == 2
    first, second = capsys.readouterr().err.splitlines()
    assert first.startswith("cannot build: ") and "config.json" in first
    assert second.startswith("cannot build: TensorRT-LLM is not installed")
    assert not out.exists()
