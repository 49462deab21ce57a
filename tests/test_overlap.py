"""Overlapped steps: a decode step launched before the previous step's samples reach the host gives
exactly the tokens of running one step at a time, through mode switches, stops, sessions, aborts and
faults, and leaves no block or sampler slot behind.

Mode switches and stops are forced at chosen positions by a runner wrapper that raises one logit of a
row by the row's *position* (not by a step count, which a step launched ahead sees one step early), so
both ways of running see the same forcing.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.engine.engine import EngineConfig, GenerationRequest, LLMEngine
from services.llm.engine.sequence import FinishReason, Mode
from services.llm.model.checkpoint import random_model
from services.llm.model.config import tiny_config
from services.llm.model.tokenizer import tiny_tokenizer

CFG = tiny_config()
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
RUNNERS = ["reference", "kernels"]  # on CPU the kernel runner uses its torch ops; on CUDA Triton + graphs
GREEDY = SamplingSettings(temperature=0.0, repetition_penalty=4.0, max_new_tokens=30, min_new_tokens=0)
SEEDED = SamplingSettings(temperature=0.05, top_k=20, top_p=0.9, repetition_penalty=10.0, max_new_tokens=30,
                          min_new_tokens=0, seed=11)


class Forcing:
    """Wraps a runner; for the sequence of request `r`, at generated offset k (the token at position
    num_prompt + k), raises the logit named by forces[r][k]: "sosp" or "stop" (text head), "eosp"
    (audio head). Every row also favours repeating its input token (the previous sample), so that a
    repetition penalty that missed the previous sample would show."""

    def __init__(self, runner, forces: dict[str, dict[int, str]]):
        self.runner, self.forces = runner, forces

    def run(self, batch, feed=None):
        # The row that samples for seq computes position num_cached + n - 1 and samples the token after it.
        last = [seq.num_cached + n - 1 for seq, n in zip(batch.seqs, batch.num_tokens)]
        modes = [seq.mode for seq in batch.seqs]
        if feed is None:
            inputs = [(seq.text_ids[p], seq.audio_ids[p]) for seq, p in zip(batch.seqs, last)]
        sampled, text, audio = self.runner.run(batch, feed)
        text, audio = text.clone(), audio.clone()
        t = a = 0
        for i in sampled:
            seq = batch.seqs[i]
            force = self.forces.get(seq.request_id.split(".")[0], {}).get(last[i] + 1 - seq.num_prompt)
            previous = (feed[0][i], feed[1][i]) if feed is not None else inputs[i]
            if modes[i] is Mode.TEXT:
                text[t, previous[0]] += 3.0
                if force in ("sosp", "stop"):
                    text[t, CFG.sosp_token_id if force == "sosp" else CFG.stop_token_ids[0]] += 1e4
                t += 1
            else:
                audio[a, previous[1]] += 3.0
                if force == "eosp":
                    audio[a, CFG.eosp_token_id] += 1e4
                a += 1
        return sampled, text, audio


FORCES = {
    "0": {3: "sosp", 9: "eosp", 14: "sosp", 20: "eosp"},  # text reply: text, speech, text, speech, text
    "1": {5: "stop"},                                     # a text reply that stops early
    "2": {6: "eosp"},                                     # an audio reply that ends its speech early
    "3": {},                                              # runs to max_new_tokens
}
TURNS = [["Hello there, how are you?", "Tell me more."], ["x" * 40, "and then?"], ["hi", "ok"], ["the weather today"]]


def make_engine(model, runner: str, overlap: bool, **kw) -> LLMEngine:
    config = EngineConfig(**{"kv_cache_bytes": 1 << 22, "max_num_seqs": 8, "max_num_batched_tokens": 64,
                             "runner": runner, "overlap": overlap, **kw})
    engine = LLMEngine(model, tiny_tokenizer(CFG), config)
    engine.runner = Forcing(engine.runner, FORCES)
    return engine


def converse(engine: LLMEngine, turns=TURNS) -> list:
    """All sessions' turns batched together, turn by turn → per session, per turn: (text ids, audio ids,
    finish reason) of the reply."""
    out = [[] for _ in turns]
    for t in range(max(len(s) for s in turns)):
        seqs = []
        for i, session in enumerate(turns):
            if t < len(session):
                req = GenerationRequest(f"{i}.{t}", GREEDY if i % 2 == 0 else SEEDED, ChunkSettings(), text=session[t],
                                        session_id=f"s{i}", audio_reply=i == 2)
                seqs.append((i, engine.make_sequence(req)))
                engine.add(seqs[-1][1])
        while engine.has_work():
            engine.step()
        for i, seq in seqs:
            out[i].append((seq.text_ids[seq.num_prompt :], seq.audio_ids[seq.num_prompt :], seq.finish_reason))
    return out


@pytest.fixture(scope="module")
def model():
    return random_model(CFG, device=DEVICE, dtype=torch.float32, seed=21)


@pytest.mark.parametrize("runner", RUNNERS)
def test_overlapped_steps_give_the_tokens_of_one_step_at_a_time(model, runner):
    one_at_a_time = converse(make_engine(model, runner, overlap=False))
    engine = make_engine(model, runner, overlap=True)
    assert converse(engine) == one_at_a_time
    # The forcing did what it is for: mode switches, a stop and an early end of speech …
    reasons = {r for session in one_at_a_time for _, _, r in session}
    assert {FinishReason.STOP, FinishReason.END_OF_SPEECH, FinishReason.LENGTH} <= reasons
    assert CFG.sosp_token_id in one_at_a_time[0][0][0]
    # … and steps ran ahead, some of whose samples had to be thrown away.
    assert engine.counters.steps_ahead > 0 and engine.counters.voided_samples > 0
    for session in list(engine.sessions.sessions):
        assert engine.close_session(session)
    assert engine.block_manager.num_used == 0 and not engine.has_work()
    assert sorted(engine.sampler.free_slots) == list(range(engine.config.max_num_seqs))


@pytest.mark.parametrize("runner", RUNNERS)
def test_an_abort_while_a_step_runs_ahead(model, runner):
    """Aborting one request between steps (a step launched ahead holds it) ends it alone: the others
    give their tokens, and every block comes back."""
    def start(engine):
        seqs = [engine.make_sequence(GenerationRequest(f"3.{i}", SEEDED, ChunkSettings(), text=f"request {i}"))
                for i in range(3)]
        for s in seqs:
            engine.add(s)
        return seqs

    calm = make_engine(model, runner, overlap=True)
    expected = start(calm)
    while calm.has_work():
        calm.step()
    engine = make_engine(model, runner, overlap=True)
    seqs = start(engine)
    for _ in range(6):
        engine.step()
    assert engine.inflight is not None and engine.counters.steps_ahead > 0
    assert engine.abort(seqs[1].seq_id)
    while engine.has_work():
        engine.step()
    assert seqs[1].finish_reason is FinishReason.ABORTED
    for i in (0, 2):
        assert (seqs[i].text_ids, seqs[i].audio_ids) == (expected[i].text_ids, expected[i].audio_ids)
    assert engine.block_manager.num_used == 0
    assert sorted(engine.sampler.free_slots) == list(range(engine.config.max_num_seqs))


def test_abort_of_everything_in_flight_leaves_no_work(model):
    engine = make_engine(model, "reference", overlap=True)
    seq = engine.make_sequence(GenerationRequest("3.0", GREEDY, ChunkSettings(), text="hello"))
    engine.add(seq)
    for _ in range(4):
        engine.step()
    assert engine.inflight is not None
    engine.abort(seq.seq_id)
    assert not engine.has_work() and engine.block_manager.num_used == 0
