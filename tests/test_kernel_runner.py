"""The kernel runner (fused ops, packed forward, bucketed decode, CUDA graphs) against the reference runner.

On CPU: the runner's own logic (packing, slot mapping, block-table mirror, bucket padding) with the
torch implementations of its ops, and with the Triton kernels in Triton's interpreter. On CUDA (through
`bash bench/gpu_smoke.sh`): Triton kernels and CUDA graphs, against the reference on the same GPU, in
float32 (greedy tokens identical) for a tiny model and the real dimensions.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from sessions import Sessions

from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.engine.engine import EngineConfig, GenerationRequest, LLMEngine
from services.llm.engine.reference import dense_logits, traced_generation
from services.llm.model.checkpoint import random_model
from services.llm.model.config import MossSpeechConfig, preset, tiny_config
from services.llm.model.tokenizer import tiny_tokenizer
from services.llm.runner.kernel_runner import KernelRunner, decode_buckets

CFG = tiny_config()
GREEDY = SamplingSettings(temperature=0.0, repetition_penalty=1.0, max_new_tokens=24, min_new_tokens=0)
SAMPLED = SamplingSettings(temperature=0.8, top_k=20, top_p=0.9, max_new_tokens=24, min_new_tokens=0, seed=9)
CUDA = torch.cuda.is_available()
try:
    import triton  # noqa: F401
    HAVE_TRITON = True
except ImportError:
    HAVE_TRITON = False

needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (bash bench/gpu_smoke.sh)")


def engine_for(model, cfg=CFG, **kw) -> LLMEngine:
    defaults = {"kv_cache_bytes": 1 << 22, "max_num_seqs": 8, "max_num_batched_tokens": 40}
    return LLMEngine(model, tiny_tokenizer(tiny_config()), EngineConfig(**{**defaults, **kw}))


def conversation(engine: LLMEngine, turns: list[list[str]], sessions: Sessions | None = None, new_tokens: int = 24,
                 system_prompt: str = "") -> list[list[tuple[list[int], list[int]]]]:
    """Several sessions, each a list of user turns, run turn by turn with all sessions' turns batched
    together, each with its session's history; → per session, per turn, the generated (text ids, audio ids)."""
    sessions = sessions if sessions is not None else Sessions()
    greedy, sampled = (replace(s, max_new_tokens=new_tokens) for s in (GREEDY, SAMPLED))
    out = [[] for _ in turns]
    for t in range(max(len(s) for s in turns)):
        seqs = []
        for i, session in enumerate(turns):
            if t < len(session):
                sampling = greedy if i % 2 == 0 else sampled
                seqs.append((i, sessions.add(engine, sessions.request(f"{i}.{t}", sampling, f"s{i}", text=session[t],
                                                                      audio_reply=(i + t) % 3 != 2,
                                                                      system_prompt=system_prompt))))
        sessions.run(engine)
        for i, seq in seqs:
            out[i].append((seq.text_ids[seq.num_prompt :], seq.audio_ids[seq.num_prompt :]))
    return out


TURNS = [["Hello there, how are you?", "Tell me more."], ["x" * 70, "and then?", "ok"], ["hi"], ["the weather today", "fine"]]


def test_decode_buckets_cover_every_batch():
    assert decode_buckets(16) == [1, 2, 4, 8, 16] and decode_buckets(12) == [1, 2, 4, 8, 12]
    assert decode_buckets(128)[-1] == 128 and decode_buckets(1) == [1]


def test_packed_weights_are_the_models_own_storage():
    model = random_model(CFG, seed=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    runner = KernelRunner(model, 16, 16, torch.device("cpu"), 4, 256, kernels="torch")
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    w = runner.forward.shared[0]
    assert w.qkv.data_ptr() == model.model.shared_block.layers[0].self_attn.q_proj.weight.data_ptr()


@pytest.mark.parametrize("kernels", ["torch", pytest.param("triton", marks=pytest.mark.skipif(
    not HAVE_TRITON or CUDA, reason="Triton on a CPU model runs only in the interpreter (CPU hosts); CUDA tests below"))])
def test_kernel_runner_matches_the_reference_over_sessions(kernels):
    """Greedy and seeded requests, chunked prefill (40 positions a step), sessions of several turns,
    text and audio replies: the same tokens as the reference runner, and the blocks come back."""
    model = random_model(CFG, seed=5)
    # the interpreter is slow (a program at a time): one session of two short turns, 2 tokens a reply, a short system turn
    # (the default's ~100 positions were most of its work; CUDA: every session, below)
    turns, new_tokens, system = (TURNS, 24, "") if kernels == "torch" else ([["Hi there.", "Go on."]], 2, "Hi.")
    ref = conversation(engine_for(model, runner="reference"), turns, new_tokens=new_tokens, system_prompt=system)
    engine, sessions = engine_for(model, runner="kernels", kernels=kernels), Sessions()
    assert conversation(engine, turns, sessions, new_tokens, system) == ref
    sessions.release_all(engine)
    assert engine.block_manager.num_used == 0


def test_kernel_runner_logits_match_a_dense_forward():
    model = random_model(CFG, seed=6)
    engine = engine_for(model, runner="kernels", kernels="torch", max_num_batched_tokens=24)
    seq = engine.make_sequence(GenerationRequest("a", GREEDY, ChunkSettings(), text="Hello there, how are you?"))
    logits = traced_generation(engine, seq)
    _, dense_a = dense_logits(model, seq.text_ids, seq.audio_ids)
    for i, (_, a) in enumerate(logits):
        torch.testing.assert_close(a, dense_a[seq.num_prompt - 1 + i], rtol=1e-4, atol=1e-4)


def test_preemption_under_the_kernel_runner_gives_the_solo_tokens():
    model = random_model(CFG, seed=7)
    prompts = [[i] + [7] * 30 + [CFG.sosp_token_id] for i in range(3)]
    sampling = SamplingSettings(temperature=0.0, max_new_tokens=40, min_new_tokens=40)

    def run(engine, which):
        seqs = [engine.make_sequence(GenerationRequest(str(i), sampling, ChunkSettings(), text_ids=prompts[i])) for i in which]
        for s in seqs:
            engine.add(s)
        while engine.has_work():
            engine.step()
        return [s.audio_ids for s in seqs]

    alone = [run(engine_for(model, runner="kernels", kernels="torch"), [i])[0] for i in range(3)]
    tight = engine_for(model, runner="kernels", kernels="torch", kv_cache_bytes=8 * 16 * CFG.kv_bytes_per_token, max_num_seqs=4)
    assert run(tight, [0, 1, 2]) == alone and tight.scheduler.num_preemptions > 0


# ---- CUDA: Triton kernels and graphs -------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graphs_replay_the_eager_steps(dtype):
    model = random_model(CFG, device="cuda", dtype=dtype, seed=8)
    eager = conversation(engine_for(model, runner="kernels", cuda_graphs=False), TURNS)
    graphed_engine = engine_for(model, runner="kernels", cuda_graphs=True)
    assert graphed_engine.runner.graphs, "no graph captured"
    assert conversation(graphed_engine, TURNS) == eager


@needs_cuda
def test_triton_graphs_match_the_reference_on_the_gpu_tiny():
    model = random_model(CFG, device="cuda", dtype=torch.float32, seed=5)
    ref = conversation(engine_for(model, runner="reference"), TURNS)
    assert conversation(engine_for(model, runner="kernels"), TURNS) == ref


def real_size(layers: int) -> MossSpeechConfig:
    """The real dimensions (hidden 4096, 32/8 heads of 128, vocabularies 151680/16512) with fewer shared
    layers, so that a float32 copy fits beside the reference's activations in a test."""
    import dataclasses

    return dataclasses.replace(preset("moss-speech"), num_shared_layers=layers, torch_dtype="float32")


@needs_cuda
def test_triton_graphs_match_the_reference_on_the_gpu_real_dimensions():
    cfg = real_size(4)
    model = random_model(cfg, device="cuda", dtype=torch.float32, seed=1)
    tok_cfg = cfg
    from services.llm.model.tokenizer import tiny_tokenizer as synth

    def engine(runner):
        return LLMEngine(model, synth(tok_cfg), EngineConfig(kv_cache_bytes=1 << 30, max_num_seqs=8,
                                                               max_num_batched_tokens=256, runner=runner))

    turns = [["Hello there, how are you?", "Tell me more."], ["the weather today"], ["x" * 90, "and?"]]
    ref = conversation(engine("reference"), turns)
    assert conversation(engine("kernels"), turns) == ref
