"""Overlapped steps: a decode step launched before the previous step's samples reach the host gives
exactly the tokens of running one step at a time, through mode switches, stops, sessions, aborts and
faults, and leaves no block or sampler slot behind (mode switches forced as in forcing.py)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from sessions import Sessions

from forcing import CFG, GREEDY, SEEDED, converse, make_engine
from services.common.sampling import ChunkSettings
from services.llm.engine.engine import GenerationRequest
from services.llm.model.checkpoint import random_model
from services.llm.sequence import FinishReason

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
RUNNERS = ["reference", "kernels"]  # on CPU the kernel runner uses its torch ops; on CUDA Triton + graphs


@pytest.fixture(scope="module")
def model():
    return random_model(CFG, device=DEVICE, dtype=torch.float32, seed=21)


@pytest.mark.parametrize("runner", RUNNERS)
def test_overlapped_steps_give_the_tokens_of_one_step_at_a_time(model, runner):
    one_at_a_time = converse(make_engine(model, runner, overlap=False))
    engine, sessions = make_engine(model, runner, overlap=True), Sessions()
    assert converse(engine, sessions=sessions) == one_at_a_time
    # The forcing did what it is for: mode switches, a stop and an early end of speech …
    reasons = {r for session in one_at_a_time for _, _, r in session}
    assert {FinishReason.STOP, FinishReason.END_OF_SPEECH, FinishReason.LENGTH} <= reasons
    assert CFG.sosp_token_id in one_at_a_time[0][0][0]
    # … and steps ran ahead, some of whose samples had to be thrown away.
    assert engine.counters.steps_ahead > 0 and engine.counters.voided_samples > 0
    sessions.release_all(engine)
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
