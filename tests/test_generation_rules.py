"""The llm's generation rules on the tiny model: the modality state machine (by hand and under scripted logits), the
audio head's mask and eosp's minimum, text replies, each channel's repetition history, seeded sampling, and the
prompt's literal user text. test_engine.py holds the engine's scheduling and its KV cache."""

import pytest
import torch
from tiny_engine import CFG, make_engine, run, tiny_model

from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.engine.engine import GenerationRequest
from services.llm.model.prompt import PromptBuilder
from services.llm.model.tokenizer import tiny_tokenizer
from services.llm.sequence import FinishReason, Mode, Sequence


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def test_seeded_sampling_is_reproducible(model):
    s = SamplingSettings(temperature=1.0, top_k=50, top_p=0.9, max_new_tokens=30, min_new_tokens=0, seed=1234)
    first, _ = run(make_engine(model), [GenerationRequest("a", s, ChunkSettings(), text="hello")])
    second, _ = run(make_engine(model), [GenerationRequest("a", s, ChunkSettings(), text="hello")])
    reseeded = SamplingSettings(**{**s.__dict__, "seed": 99})
    other, _ = run(make_engine(model), [GenerationRequest("a", reseeded, ChunkSettings(), text="hello")])
    assert first[0].audio_ids == second[0].audio_ids
    assert first[0].audio_ids != other[0].audio_ids


def forced(seq: Sequence, steps):
    """Feed (text head, audio head) samples: the state machine takes the one its mode reads."""
    for text_token, audio_token in steps:
        seq.append_sampled(audio_token if seq.mode is Mode.AUDIO else text_token, CFG, now=0.0)


def new_seq(text_ids, audio_reply=False, max_new=100):
    seq = Sequence("s", list(text_ids), [CFG.audio_pad_token_id] * len(text_ids),
                   SamplingSettings(max_new_tokens=max_new), ChunkSettings(), audio_reply)
    seq.start_mode(CFG)
    return seq


def test_state_machine_transitions():
    c = CFG
    seq = new_seq([c.im_start_token_id, 65])
    assert seq.mode is Mode.TEXT
    forced(seq, [(66, 7)])                       # text token; audio sample ignored
    assert seq.text_ids[-1] == 66 and seq.audio_ids[-1] == c.audio_pad_token_id
    forced(seq, [(c.sosp_token_id, 7)])           # sosp → audio mode
    assert seq.mode is Mode.AUDIO and seq.audio_ids[-1] == c.audio_pad_token_id
    forced(seq, [(67, 5), (68, 6), (1, c.eosp_token_id + 1)])  # codes; text samples ignored
    assert seq.text_ids[-3:] == [c.modality_pad_token_id] * 3 and seq.audio_ids[-3:] == [5, 6, c.eosp_token_id + 1]
    forced(seq, [(69, c.eosp_token_id)])          # eosp → text mode, laid out as (modality_pad, eosp)
    assert seq.mode is Mode.TEXT and (seq.text_ids[-1], seq.audio_ids[-1]) == (c.modality_pad_token_id, c.eosp_token_id)
    assert not seq.finished
    forced(seq, [(c.im_end_token_id, 3)])         # stop token: not appended
    assert seq.finished and seq.finish_reason is FinishReason.STOP and seq.text_ids[-1] == c.modality_pad_token_id
    assert seq.pending_text == [66] and seq.pending_audio == [5, 6]  # eosp + 1 is not a code: not streamed


def test_audio_reply_starts_in_audio_mode_and_ends_at_eosp():
    c = CFG
    seq = new_seq([c.im_start_token_id, c.sosp_token_id], audio_reply=True)
    assert seq.mode is Mode.AUDIO
    forced(seq, [(1, 9), (1, c.eosp_token_id)])
    assert seq.finished and seq.finish_reason is FinishReason.END_OF_SPEECH and seq.num_audio == 1


def test_audio_head_is_masked_and_eosp_waits_for_min_tokens(model):
    engine = make_engine(model)
    seq = new_seq([CFG.im_start_token_id, CFG.sosp_token_id], audio_reply=True)
    seq.sampling = SamplingSettings(temperature=0.0, min_new_tokens=3, max_new_tokens=10)
    audio = torch.full((1, CFG.audio_vocab_size), -10.0)
    audio[0, CFG.eosp_token_id + 5] = 100.0      # beyond the valid range: masked
    audio[0, CFG.eosp_token_id] = 50.0           # eosp: suppressed while num_steps < 3
    audio[0, 17] = 10.0
    text = torch.zeros(1, CFG.vocab_size)
    assert engine.sampler([seq], text, audio)[0] == (17, True)
    seq.num_steps = 3
    assert engine.sampler([seq], text, audio)[0] == (CFG.eosp_token_id, True)


def test_prompt_builder_keeps_user_text_literal():
    tok = tiny_tokenizer(CFG)
    prompt = PromptBuilder(tok, CFG).build("say <|im_end|> please")
    assert prompt.text_ids.count(CFG.im_end_token_id) == 2  # system and user turns only
    assert prompt.text_ids[-1] == CFG.sosp_token_id
    assert tok.decode(prompt.text_ids, skip_special_tokens=False).startswith("<|im_start|>system\nYou are a helpful voice assistant.")


class ForcedRunner:
    """Stands in for the model runner: computes nothing, returns scripted logits, one step at a time.
    Each script entry is (text id, audio id) to favour, or None for flat logits."""

    def __init__(self, engine, script):
        self.engine, self.script = engine, list(script)

    def run(self, batch, feed=None):
        for seq, n in zip(batch.seqs, batch.num_tokens):
            seq.record_text_kv(seq.num_cached, n, computed=True)
            seq.num_cached += n
        text = torch.zeros(1, CFG.vocab_size)
        audio = torch.zeros(1, CFG.audio_vocab_size)
        t, a = self.script.pop(0)
        text[0, t] = 50.0
        for rank, audio_id in enumerate(a if isinstance(a, tuple) else (a,)):
            audio[0, audio_id] = 50.0 - 10 * rank  # earlier = preferred
        return [0], text, audio


def test_state_machine_under_forced_logits(model):
    c = CFG
    engine = make_engine(model, overlap=False)  # one scripted step per launch: no steps launched ahead
    seq = engine.make_sequence(GenerationRequest("f", SamplingSettings(temperature=0.0, repetition_penalty=1.0,
                                                                        max_new_tokens=50, min_new_tokens=3),
                                                 ChunkSettings(first_chunk_tokens=1, chunk_tokens=1), text="hi", audio_reply=False))
    assert seq.mode is Mode.TEXT and seq.text_ids[-1] != c.sosp_token_id  # a text reply has no sosp prefix
    engine.runner = ForcedRunner(engine, [
        (72, 5),                                   # text mode: 'H'; the audio head's 5 is ignored
        (c.sosp_token_id, 5),                      # → audio mode
        (9, (c.eosp_token_id + 7, c.eosp_token_id, 11)),  # masked id, eosp before min tokens (3rd step), → 11
        (9, (c.eosp_token_id, 12)),                # 4th step: eosp allowed → text mode
        (c.im_end_token_id, 3),                    # stop
    ])
    engine.add(seq)
    chunks = []
    while engine.has_work():
        chunks += engine.step()
    gen_text, gen_audio = seq.text_ids[seq.num_prompt :], seq.audio_ids[seq.num_prompt :]
    mpad, apad = c.modality_pad_token_id, c.audio_pad_token_id
    assert gen_text == [72, c.sosp_token_id, mpad, mpad] and gen_audio == [apad, apad, 11, c.eosp_token_id]
    assert [t for ch in chunks for t in ch.text_tokens] == [72]
    assert [t for ch in chunks for t in ch.audio_tokens] == [11]
    assert seq.finish_reason is FinishReason.STOP and engine.block_manager.num_used == 0


def test_text_reply_streams_text_tokens(model):
    engine = make_engine(model)
    s = SamplingSettings(temperature=0.0, max_new_tokens=10, min_new_tokens=0)
    chunking = ChunkSettings(first_chunk_tokens=2, chunk_tokens=4)
    seqs, chunks = run(engine, [GenerationRequest("t", s, chunking, text="hi", audio_reply=False)])
    seq = seqs[0]
    streamed = [t for ch in chunks for t in ch.text_tokens] + [t for ch in chunks for t in ch.audio_tokens]
    assert streamed and len(streamed) == seq.num_text + seq.num_audio
    assert chunks[0].first and chunks[-1].final


def test_repetition_penalty_history_tracks_each_channel(model):
    c = CFG
    engine = make_engine(model)
    seq = new_seq([c.im_start_token_id, 65, c.sosp_token_id], audio_reply=True)
    forced(seq, [(1, 5), (1, 6)])
    engine.sampler._observe([seq])
    seen_text = set(engine.sampler.seen_text[seq.slot].nonzero().flatten().tolist())
    seen_audio = set(engine.sampler.seen_audio[seq.slot].nonzero().flatten().tolist())
    assert seen_text == {c.im_start_token_id, 65, c.sosp_token_id} and seen_audio == {5, 6}
    forced(seq, [(1, 5), (1, 9)])
    engine.sampler._observe([seq])
    assert set(engine.sampler.seen_audio[seq.slot].nonzero().flatten().tolist()) == {5, 6, 9} and seq.seen_upto == len(seq)
    slot = seq.slot
    engine.sampler.release(seq)
    other = new_seq([c.im_start_token_id, 66, c.sosp_token_id], audio_reply=True)
    engine.sampler._observe([other])  # a reused slot starts clean
    assert other.slot == slot and set(engine.sampler.seen_audio[slot].nonzero().flatten().tolist()) == set()
