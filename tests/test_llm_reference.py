"""The llm against an outside implementation: transformers' Qwen3ForCausalLM as the oracle of both of its paths.

Each path through MOSS-Speech is a Qwen3 model (services/llm/model/qwen3_map.py): the shared layers, then one branch's,
its final norm and its head. Two Qwen3 models built from literal values (the published config's layout, scaled down
to the tiny preset's sizes; never from our own config object, so that a misreading shared by our config and our
model cannot pass) take our weights by name, and their logits are compared with ours in float32:
- through our dense forward, both heads at every position;
- through the engine with its paged KV cache, each step's logits of the head it sampled: the reference runner and
  the kernel runner (its Triton kernels in Triton's interpreter), plainly, with a prefix-cache hit, and for a
  sequence preempted and recomputed;
- and greedy generation through the engine against transformers' own `generate`, given the masks our sampler
  applies and our modality state machine written out here again.
The oracle's input embedding is built here too: a position's text embedding, or its audio embedding where its text
channel holds modality_pad. What it does not check: the state machine's rules themselves and the special token ids
(tests/test_generation_rules.py; the ids against the published constants: tests/test_presets.py).
"""

from __future__ import annotations

import pytest
import torch
from tiny_engine import make_engine
from transformers import LogitsProcessor, LogitsProcessorList, Qwen3Config, Qwen3ForCausalLM

from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.engine.engine import GenerationRequest
from services.llm.engine.reference import dense_logits, traced_generation
from services.llm.model.checkpoint import random_model
from services.llm.model.config import MossSpeechConfig, tiny_config
from services.llm.model.qwen3_map import qwen3_names

# The published config.json's layout (RoPE base 1e6, RMS eps 1e-6, SiLU, no attention bias, untied heads, q/k norms
# per head), at the tiny preset's sizes: 2 shared layers + 1 of a branch, 4 heads of 16 over 2 KV heads.
QWEN3 = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             num_hidden_layers=3, rms_norm_eps=1e-6, max_position_embeddings=4096, hidden_act="silu",
             attention_bias=False, tie_word_embeddings=False,
             rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})
VOCAB = {"text": 256 + 37, "audio": 1024 + 128}
# The tiny preset's special ids (the real offsets from <|endoftext|> at 256; 1,024 codes, then eosp)
IM_START, SOSP, MODALITY_PAD, STOPS = 257, 259, 280, (256, 258)
EOSP, AUDIO_PAD = 1024, 512
GREEDY = SamplingSettings(temperature=0.0, repetition_penalty=1.0, max_new_tokens=16, min_new_tokens=0)
# Prompts given as both channels: one that ends in text mode, one that ends in audio mode (sosp last); each has an
# earlier audio segment, so that positions fed the audio embedding come before every step.
SEGMENT = ([SOSP] + [MODALITY_PAD] * 5, [AUDIO_PAD, 17, 300, 999, 4, EOSP])
# Over one 16-position block each, so that a second run of the same prompt finds its first block in the cache.
PROMPTS = {
    "text": ([IM_START, 72, 105, 33, 32, 72] + SEGMENT[0] + [10, 87, 104, 97, 116, 63],
             [AUDIO_PAD] * 6 + SEGMENT[1] + [AUDIO_PAD] * 6),
    "audio": ([IM_START, 83, 97, 121, 32, 105, 116] + SEGMENT[0] + [10, 73, 116, SOSP],
              [AUDIO_PAD] * 7 + SEGMENT[1] + [AUDIO_PAD] * 4),
}


def with_random_norms(model, seed: int):
    """random_model's RMSNorm weights are ones, under which a norm commutes with RoPE's rotation and one branch's
    final norm equals the other's: drawn here around 1, so that a norm in the wrong place or the wrong branch's
    shows in the logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                weight.copy_(1 + 0.5 * torch.randn(weight.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def model():
    return with_random_norms(random_model(tiny_config(), seed=11), seed=11)


@pytest.fixture(scope="module")
def oracles(model):
    return oracles_of(model)


@pytest.fixture(scope="module")
def switchy():
    """A tiny model whose heads favour sosp and eosp (their rows tripled), so that greedy replies switch modes
    within 32 tokens: text, audio, text again, several times."""
    model = with_random_norms(random_model(tiny_config(), seed=11), seed=11)
    with torch.no_grad():
        model.text_lm_head.weight[SOSP] *= 3
        model.audio_lm_head.weight[EOSP] *= 3
    return model, oracles_of(model)


def oracles_of(model) -> dict[str, Qwen3ForCausalLM]:
    """The text path's and the audio path's Qwen3ForCausalLM, holding our weights by name."""
    ours = model.state_dict()
    built, used = {}, set()
    for path in ("text", "audio"):
        qwen = Qwen3ForCausalLM(Qwen3Config(vocab_size=VOCAB[path], **QWEN3)).eval()
        names = qwen3_names(model.cfg, path)
        assert set(names) == set(qwen.state_dict())  # every weight of the Qwen3 model has its name in ours
        qwen.load_state_dict({theirs: ours[mine] for theirs, mine in names.items()}, strict=True)
        built[path] = qwen
        used |= set(names.values())
    assert used == set(ours)  # and every weight of ours is in one path or both
    return built


def embeds(model, text_ids: list[int], audio_ids: list[int]) -> torch.Tensor:
    """The oracle's input embedding [1, n, hidden], written out here: the audio table's row for a position whose
    text channel holds modality_pad, the text table's otherwise."""
    weights = model.state_dict()
    text, audio = torch.tensor(text_ids), torch.tensor(audio_ids)
    rows = torch.where((text == MODALITY_PAD)[:, None], weights["model.audio_embed.weight"][audio],
                       weights["model.embed_tokens.weight"][text])
    return rows[None]


@torch.inference_mode()
def oracle_logits(oracles, model, text_ids, audio_ids) -> dict[str, torch.Tensor]:
    """Each path's logits at every position of the sequence: {"text": [n, 293], "audio": [n, 1152]}."""
    x = embeds(model, text_ids, audio_ids)
    return {path: qwen(inputs_embeds=x).logits[0].float() for path, qwen in oracles.items()}


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    """Within float32's tolerance: max |diff| <= 1e-4 of the logits' scale."""
    scale = theirs.abs().max().item()
    diff = (ours - theirs).abs().max().item()
    assert diff <= 1e-4 * scale, f"{what}: max |diff| {diff:.3g} over a scale of {scale:.3g}"


def test_the_dense_forward_is_qwen3s_on_both_paths(model, oracles):
    for text_ids, audio_ids in PROMPTS.values():
        ours = dense_logits(model, text_ids, audio_ids)
        theirs = oracle_logits(oracles, model, text_ids, audio_ids)
        assert_close(ours[0], theirs["text"], "text head")
        assert_close(ours[1], theirs["audio"], "audio head")


def check_steps(model, oracles, seq, steps) -> set[str]:
    """Each engine step's logits (the head its mode sampled) against the oracle's at the position that step read
    (a dense oracle forward over the finished sequence) → the heads checked."""
    theirs = oracle_logits(oracles, model, seq.text_ids, seq.audio_ids)
    heads = set()
    for i, (text, audio) in enumerate(steps):
        at = seq.num_prompt - 1 + i
        head, logits = ("text", text) if text is not None else ("audio", audio)
        assert_close(logits, theirs[head][at], f"step {i} ({head} head, position {at})")
        heads.add(head)
    assert len(steps) == seq.num_steps > 0
    return heads


def request(name: str, prompt: str, sampling: SamplingSettings = GREEDY) -> GenerationRequest:
    text_ids, audio_ids = PROMPTS[prompt]
    return GenerationRequest(name, sampling, ChunkSettings(), text_ids=list(text_ids), audio_ids=list(audio_ids),
                             audio_reply=False)


# The kernel runner's Triton kernels run in the interpreter on a CPU, a program at a time (seconds a step): fewer
# tokens there, and its own logic (packing, slot mapping, block tables) with torch's ops for the preempted sequence
RUNNERS = {"reference-runner": ("reference", {}, 16), "kernel-runner-triton": ("kernels", {"kernels": "triton"}, 2),
           "kernel-runner-torch-ops": ("kernels", {"kernels": "torch"}, 16)}


@pytest.mark.parametrize("which", ["reference-runner", "kernel-runner-triton"])
def test_the_engine_with_paged_kv_is_qwen3s(model, oracles, which):
    """Both heads (a prompt that ends in text mode, one that ends in audio mode), then one of them again: its leading
    block comes from the prefix cache."""
    runner, options, tokens = RUNNERS[which]
    engine = make_engine(model, runner=runner, **options)
    sampling = SamplingSettings(temperature=0.0, repetition_penalty=1.0, max_new_tokens=tokens, min_new_tokens=0)
    heads = set()
    for name in ("text", "audio", "audio-again"):
        seq = engine.make_sequence(request(name, name.removesuffix("-again"), sampling))
        hits = engine.block_manager.hit_tokens
        heads |= check_steps(model, oracles, seq, traced_generation(engine, seq))
        if name.endswith("-again"):
            assert engine.block_manager.hit_tokens > hits  # (its leading block was served from the cache)
    assert heads == {"text", "audio"} and engine.block_manager.num_used == 0


@pytest.mark.parametrize("which", ["reference-runner", "kernel-runner-torch-ops"])
def test_a_preempted_and_recomputed_sequence_is_qwen3s(model, oracles, which):
    """Two sequences, each growing into a third block, in a pool of four: the newer is preempted (its blocks freed)
    and recomputed when there is room, and every step it sampled is the oracle's."""
    runner, options, tokens = RUNNERS[which]
    block, positions = 16, engine_positions(model, runner, blocks=4)
    engine = make_engine(model, runner=runner, kv_cache_bytes=positions, max_num_seqs=3, **options)
    grow = 2 * block + 1 - len(PROMPTS["audio"][0])  # into each one's third block
    sampling = SamplingSettings(temperature=0.0, repetition_penalty=1.0, max_new_tokens=grow + tokens, min_new_tokens=0)
    others = [engine.make_sequence(request("other", "audio", sampling))]
    for seq in others:
        engine.add(seq)
    preempted = []
    preempt = engine.scheduler.preempt
    engine.scheduler.preempt = lambda seq: (preempted.append(seq.request_id), preempt(seq))
    newest = engine.make_sequence(request("newest", "audio", sampling))
    check_steps(model, oracles, newest, traced_generation(engine, newest))
    assert "newest" in preempted and all(seq.finished for seq in others)


def engine_positions(model, runner: str, blocks: int) -> int:
    """The KV budget (bytes) that makes `blocks` blocks of 16 positions for this runner (the kernel runner keeps each
    position's trunk output beside its K/V: services/llm/engine/runners.py)."""
    from services.llm.engine.engine import EngineConfig
    from services.llm.engine.runners import bytes_per_position

    return blocks * 16 * bytes_per_position(model.cfg, EngineConfig(runner=runner), torch.device("cpu"))


class SamplerMasks(LogitsProcessor):
    """Our sampler's audio-head masks, for transformers' generate on the audio path: ids from eosp + 2 up never,
    eosp not before min_new_tokens (counted from `done`, the steps taken before this call)."""

    def __init__(self, prompt_len: int, min_new: int, done: int):
        self.prompt_len, self.min_new, self.done = prompt_len, min_new, done

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, EOSP + 2:] = float("-inf")
        if self.done + input_ids.shape[1] - self.prompt_len < self.min_new:
            scores[:, EOSP] = float("-inf")
        return scores


@torch.inference_mode()
def oracle_generate(model, oracles, text_ids, audio_ids, max_new: int, min_new: int) -> tuple[list[int], list[int]]:
    """Greedy generation by transformers' `generate`, one mode at a time, the state machine written out again: text
    mode on the text path until a stop token or sosp (sosp enters audio mode: (sosp, audio_pad) appended); audio mode
    on the audio path (each code's input is its audio embedding) until eosp (back to text mode: (modality_pad, eosp))
    → the sequence's two channels."""
    text_ids, audio_ids = list(text_ids), list(audio_ids)
    prompt, done = len(text_ids), 0
    audio_mode = text_ids[-1] == SOSP
    while done < max_new:
        x = embeds(model, text_ids, audio_ids)
        if audio_mode:
            new = oracles["audio"].generate(inputs_embeds=x, max_new_tokens=max_new - done, do_sample=False,
                                            eos_token_id=EOSP, pad_token_id=0, logits_processor=LogitsProcessorList(
                                                [SamplerMasks(0, min_new, done)]))[0].tolist()
        else:
            new = oracles["text"].generate(inputs_embeds=x, max_new_tokens=max_new - done, do_sample=False,
                                           eos_token_id=[SOSP, *STOPS], pad_token_id=0)[0].tolist()
        for token in new:
            done += 1
            if audio_mode:
                text_ids.append(MODALITY_PAD)
                audio_ids.append(token)
                if token == EOSP:
                    audio_mode = False
                    break
            elif token in STOPS:
                return text_ids, audio_ids
            else:
                text_ids.append(token)
                audio_ids.append(AUDIO_PAD)
                if token == SOSP:
                    audio_mode = True
                    break
    assert len(text_ids) - prompt <= max_new
    return text_ids, audio_ids


@pytest.mark.parametrize("prompt, min_new, switches", [("text", 0, True), ("audio", 4, True), ("audio", 32, False)])
def test_greedy_generation_is_transformers_generate(switchy, prompt, min_new, switches):
    """32 greedy tokens through our engine and through transformers' generate, with our sampler's masks (audio ids
    above eosp + 1, eosp before min_new_tokens) and the mode switches (sosp, eosp) where the reply makes them."""
    model, oracles = switchy
    engine = make_engine(model)
    sampling = SamplingSettings(temperature=0.0, repetition_penalty=1.0, max_new_tokens=32, min_new_tokens=min_new)
    seq = engine.make_sequence(request("g", prompt, sampling))
    engine.add(seq)
    while engine.has_work():
        engine.step()
    assert seq.num_steps == 32 or seq.finished
    theirs = oracle_generate(model, oracles, *PROMPTS[prompt], max_new=32, min_new=min_new)
    assert (seq.text_ids, seq.audio_ids) == theirs
    reply_text, reply_audio = seq.text_ids[seq.num_prompt:], seq.audio_ids[seq.num_prompt:]
    assert (SOSP in reply_text and EOSP in reply_audio) == switches  # (the switches this case is for)


# config.json as published (the fields DESIGN.md §2 gives; Qwen3-8B's layout): what both readers take from it
PUBLISHED = {"architectures": ["MossSpeechForCausalLM"], "model_type": "moss_speech", "hidden_size": 4096,
             "intermediate_size": 12288, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
             "num_hidden_layers": 36, "num_shared_layers": 32, "num_modality_layers": 4, "rms_norm_eps": 1e-6,
             "rope_theta": 1000000.0, "rope_scaling": None, "max_position_embeddings": 40960, "hidden_act": "silu",
             "attention_bias": False, "tie_word_embeddings": False, "vocab_size": 151680, "torch_dtype": "bfloat16"}


def test_the_published_config_reads_as_transformers_reads_it():
    ours = MossSpeechConfig.from_dict(PUBLISHED)
    qwen3_fields = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                    "num_hidden_layers", "rms_norm_eps", "max_position_embeddings", "vocab_size")
    theirs = Qwen3Config(**{k: PUBLISHED[k] for k in qwen3_fields}, rope_theta=PUBLISHED["rope_theta"],
                         rope_scaling=PUBLISHED["rope_scaling"])
    assert theirs.rope_parameters == {"rope_type": "default", "rope_theta": ours.rope_theta} and ours.rope_theta == 1e6
    for name in qwen3_fields:
        assert getattr(ours, name) == getattr(theirs, name), name
    # transformers 5's form of the same RoPE reads the same
    v5 = {k: v for k, v in PUBLISHED.items() if k not in ("rope_theta", "rope_scaling")}
    assert MossSpeechConfig.from_dict({**v5, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}).rope_theta == 5e5


@pytest.mark.parametrize("change, refused", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, "rope_scaling"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e6, "factor": 2.0}}, "rope_parameters"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_bias": True}, "attention_bias"),
    ({"use_sliding_window": True, "sliding_window": 4096}, "use_sliding_window"),
    ({"layer_types": ["sliding_attention"] * 36}, "layer_types"),
])
def test_what_the_model_does_not_implement_is_refused_by_name(change, refused):
    with pytest.raises(ValueError, match=f"config.json: {refused} .* is not supported"):
        MossSpeechConfig.from_dict({**PUBLISHED, **change})


def test_positions_past_the_models_own_are_refused(model):
    with pytest.raises(ValueError, match="--max-model-len 8192 is over the model's max_position_embeddings"):
        make_engine(model, max_model_len=8192)
