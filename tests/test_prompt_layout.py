"""The prompt of each of MOSS-Speech's four modes, token by token.

The layout is MOSS-Speech's: `<|im_start|>{role}\\n...<|im_end|>\\n` turns; an audio segment is, position by
position, (sosp, audio_pad), then (modality_pad, code) for each code, then (modality_pad, eosp); a spoken reply's
assistant prefix ends with (sosp, audio_pad); the default system prompt follows the reply's modality. The official
processor (`processing_moss_speech.py`) lives only in the model's Hugging Face repository, which this machine cannot
reach: the expected rows below are written from its published constants and the official demo's driver
(`utils/interface.py`), which two independent ports reproduce (docs/encoder.md)."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument
from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.engine.config import EngineConfig
from services.llm.engine.engine import GenerationRequest, LLMEngine
from services.llm.model.checkpoint import random_model
from services.llm.model.config import tiny_config
from services.llm.model.prompt import AUDIO_SYSTEM_PROMPT, TEXT_SYSTEM_PROMPT, PromptBuilder
from services.llm.model.tokenizer import tiny_tokenizer

CFG = tiny_config()
CODES = [7, 0, 1023, 512, 31]


def rows(tok, text: str) -> list[tuple[int, int]]:
    """Text as (text id, audio_pad) rows."""
    return [(i, CFG.audio_pad_token_id) for i in tok.encode(text, add_special_tokens=False).ids]


def text_turn(tok, role: str, content: str) -> list[tuple[int, int]]:
    pad = CFG.audio_pad_token_id
    return [(CFG.im_start_token_id, pad), *rows(tok, f"{role}\n{content}"), (CFG.im_end_token_id, pad), *rows(tok, "\n")]


def spoken_turn(tok, role: str, codes: list[int]) -> list[tuple[int, int]]:
    pad, mpad = CFG.audio_pad_token_id, CFG.modality_pad_token_id
    return [(CFG.im_start_token_id, pad), *rows(tok, f"{role}\n"), (CFG.sosp_token_id, pad),
            *[(mpad, c) for c in codes], (mpad, CFG.eosp_token_id), (CFG.im_end_token_id, pad), *rows(tok, "\n")]


def prefix(tok, spoken: bool) -> list[tuple[int, int]]:
    return [(CFG.im_start_token_id, CFG.audio_pad_token_id), *rows(tok, "assistant\n")] + \
        ([(CFG.sosp_token_id, CFG.audio_pad_token_id)] if spoken else [])


@pytest.mark.parametrize("user_speaks", [True, False], ids=["speech in", "text in"])
@pytest.mark.parametrize("reply_speaks", [True, False], ids=["speech out", "text out"])
def test_each_mode_is_laid_out_as_moss_speech_lays_it_out(user_speaks, reply_speaks):
    tok = tiny_tokenizer(CFG)
    user = CODES if user_speaks else "What is the weather like?"
    prompt = PromptBuilder(tok, CFG).build(user, audio_reply=reply_speaks)
    system = text_turn(tok, "system", AUDIO_SYSTEM_PROMPT if reply_speaks else TEXT_SYSTEM_PROMPT)
    expected = system + (spoken_turn(tok, "user", CODES) if user_speaks else text_turn(tok, "user", user)) \
        + prefix(tok, reply_speaks)
    assert list(zip(prompt.text_ids, prompt.audio_ids)) == expected
    assert prompt.turn_start == len(system)


def test_a_spoken_turn_in_a_session_joins_the_history_with_its_codes():
    """The llm reports what a turn added (turn_tokens): for a spoken turn, the user's codes as laid out above."""
    engine = LLMEngine(random_model(CFG, seed=0), tiny_tokenizer(CFG), EngineConfig(max_num_seqs=2, max_model_len=512,
                                                                                  kv_cache_bytes=8 << 20))
    sampling = SamplingSettings(temperature=0.0, max_new_tokens=6, min_new_tokens=6, seed=0)
    req = GenerationRequest("a", sampling, ChunkSettings(), user_codes=CODES, session_id="s")
    engine.add(engine.make_sequence(req))
    tokens = None
    while engine.has_work():
        for chunk in engine.step():
            tokens = chunk.turn_tokens or tokens
    tok = tiny_tokenizer(CFG)
    user = spoken_turn(tok, "user", CODES)
    system = text_turn(tok, "system", AUDIO_SYSTEM_PROMPT)
    assert list(zip(*tokens))[len(system) : len(system) + len(user)] == user


@pytest.mark.parametrize("codes, message", [([], "at least one code"), ([5, CFG.audio_codebook_size], "got 1024"),
                                            ([-1], "got -1")])
def test_bad_codes_are_refused_naming_the_field(codes, message):
    engine = LLMEngine(random_model(CFG, seed=0), tiny_tokenizer(CFG), EngineConfig(max_num_seqs=2, max_model_len=512,
                                                                                  kv_cache_bytes=8 << 20))
    with pytest.raises(InvalidArgument, match=message) as err:
        engine.make_sequence(GenerationRequest("a", SamplingSettings(), ChunkSettings(), user_codes=codes))
    assert err.value.field == "audio.codes"
