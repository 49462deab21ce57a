"""The batched sampler: exact sampling, masks, independence from batch mates, numerical safety for every
value the API accepts (property-based), and one failing request never failing another."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.engine.engine import EngineConfig, GenerationRequest, LLMEngine
from services.llm.model.checkpoint import random_model
from services.llm.model.config import tiny_config
from services.llm.model.tokenizer import tiny_tokenizer
from services.llm.sampling import GREEDY_BELOW, TOPK_CAP, RowSettings, hashed_uniform, sample_rows, top_candidates
from services.llm.sequence import FinishReason

CFG = tiny_config()


@pytest.fixture(scope="module")
def model():
    return random_model(CFG, seed=3)


def rows(n, temperature=1.0, top_p=1.0, penalty=1.0, top_k=0, seed=None, step=0):
    full = lambda v, dt: torch.full((n,), v, dtype=dt)  # noqa: E731
    seeds = torch.arange(n, dtype=torch.long) * 7919 + 1 if seed is None else full(seed, torch.long)
    return RowSettings(full(temperature, torch.float32), full(top_p, torch.float32), full(penalty, torch.float32),
                       full(top_k, torch.long), seeds, full(step, torch.long), torch.arange(n), torch.zeros(n, dtype=torch.bool))


def test_hashed_noise_is_uniform_and_keyed():
    seed = torch.tensor([1, 2, -5])
    u = hashed_uniform(seed, torch.tensor([0, 0, 0]), torch.arange(20000).repeat(3, 1), salt=0)
    assert 0 < float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.005
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    again = hashed_uniform(seed, torch.tensor([0, 0, 0]), torch.arange(20000).repeat(3, 1), salt=0)
    assert torch.equal(u, again)


def test_draws_follow_the_softmax():
    """4000 rows with distinct seeds, one distribution over 6 tokens: frequencies within 4 sigma."""
    n = 4000
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0]).repeat(n, 1)
    temperature = 0.8
    ids, ok = sample_rows(logits, rows(n, temperature=temperature), torch.zeros(n, 6, dtype=torch.bool), 0, None)
    assert ok.all()
    p = torch.softmax(logits[0] / temperature, 0)
    freq = torch.bincount(ids, minlength=6).float() / n
    sigma = (p * (1 - p) / n).sqrt()
    assert ((freq - p).abs() <= 4 * sigma + 1e-3).all(), (freq, p)


def test_top_k_top_p_and_penalty_semantics():
    n = 2000
    logits = torch.tensor([3.0, 2.9, 2.8, 1.0, 0.5, -2.0, 2.95]).repeat(n, 1)
    seen = torch.zeros(n, 7, dtype=torch.bool)
    ids, _ = sample_rows(logits, rows(n, top_k=2), seen, 0, TOPK_CAP)
    assert set(ids.tolist()) == {0, 6}                     # the two largest
    ids, _ = sample_rows(logits, rows(n, top_p=0.3), seen, 0, None)
    assert set(ids.tolist()) <= {0, 6} and len(set(ids.tolist())) == 2  # 0 alone covers < 0.3: 6 joins
    seen[:, 0] = True
    ids, _ = sample_rows(logits, rows(n, temperature=0.0, penalty=2.0), seen, 0, None)
    assert set(ids.tolist()) == {6}                        # 3.0 / 2 = 1.5 falls behind 2.95
    neg = torch.tensor([-1.0, -1.5]).repeat(n, 1)
    ids, _ = sample_rows(neg, rows(n, temperature=0.0, penalty=2.0), torch.tensor([[True, False]]).repeat(n, 1), 0, None)
    assert set(ids.tolist()) == {1}                        # -1 * 2 = -2 < -1.5


def test_candidate_and_full_sort_paths_agree():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 5000, generator=g) * 3
    for top_k, top_p in ((1, 1.0), (20, 0.95), (32, 0.5), (7, 1.0)):
        r = rows(64, temperature=0.7, top_k=top_k, top_p=top_p, step=3)
        seen = torch.rand(64, 5000, generator=g) < 0.01
        a, _ = sample_rows(logits, r, seen, 0, TOPK_CAP)
        b, _ = sample_rows(logits, r, seen, 0, None)
        assert torch.equal(a, b), (top_k, top_p)


def test_a_row_does_not_depend_on_its_batch_mates():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 300, generator=g)
    r = rows(8, temperature=0.9, top_p=0.9, top_k=40, step=5)
    seen = torch.zeros(8, 300, dtype=torch.bool)
    together, _ = sample_rows(logits, r, seen, 0, None)
    for i in range(8):
        one = RowSettings(*(getattr(r, f)[i : i + 1] for f in RowSettings.__dataclass_fields__))
        alone, _ = sample_rows(logits[i : i + 1], one, seen[i : i + 1], 0, None)
        assert int(alone) == int(together[i])


@pytest.mark.parametrize("temperature,penalty", [(1e-45, 1.0), (1e-45, 1e-45), (0.6, 1e-45), (2.0, 10.0), (1e-7, 0.5)])
def test_extreme_settings_and_logits_give_valid_ids(temperature, penalty):
    logits = torch.tensor([[1e38, -1e38, 0.0, 3.0], [float("-inf"), 5.0, 5.0, float("-inf")], [0.0, 0.0, 0.0, 0.0]])
    seen = torch.tensor([[True, True, False, False]] * 3)
    ids, ok = sample_rows(logits, rows(3, temperature=temperature, penalty=penalty, top_k=10**9, top_p=1e-9), seen, 0, None)
    assert ok.all() and all(0 <= i < 4 for i in ids.tolist())
    assert int(ids[1]) in (1, 2)  # never a masked token


def test_non_finite_logits_fail_only_their_row():
    logits = torch.tensor([[1.0, 2.0, 0.5], [float("nan"), 1.0, 2.0], [float("inf"), 0.0, 0.0], [0.1, 0.2, 0.3]])
    ids, ok = sample_rows(logits, rows(4, temperature=0.0), torch.zeros(4, 3, dtype=torch.bool), 0, None)
    assert ok.tolist() == [True, False, False, True] and ids[0] == 1 and ids[3] == 2


# ---- through the engine ----------------------------------------------------------------------
def make_engine(model, **kw):
    return LLMEngine(model, tiny_tokenizer(CFG), EngineConfig(**{"kv_cache_bytes": 1 << 22, **kw}))


INNOCENT = [SamplingSettings(temperature=0.8, top_k=20, top_p=0.9, max_new_tokens=12, min_new_tokens=12, seed=5),
            SamplingSettings(temperature=0.0, repetition_penalty=1.3, max_new_tokens=12, min_new_tokens=12),
            SamplingSettings(temperature=1.2, top_k=0, top_p=1.0, max_new_tokens=12, min_new_tokens=12, seed=77)]


def generate(engine, settings_list, text="hello there"):
    seqs = [engine.make_sequence(GenerationRequest(str(i), s, ChunkSettings(), text=text)) for i, s in enumerate(settings_list)]
    for s in seqs:
        engine.add(s)
    errors = []
    while engine.has_work():
        errors += [c.error for c in engine.step() if c.error]
    return seqs, errors


@pytest.fixture(scope="module")
def innocent_alone(model):
    return [generate(make_engine(model), [s])[0][0].audio_ids for s in INNOCENT]


wild_floats = st.one_of(st.floats(min_value=0.0, max_value=10.0), st.sampled_from([0.0, 1e-45, 5e-324, 1e-38, 1e-7, 1e-5, 2.0, 10.0]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(temperature=wild_floats, top_p=wild_floats, top_k=st.one_of(st.integers(0, 50), st.integers(0, 2**62)),
       penalty=wild_floats, min_new=st.integers(0, 12), seed=st.one_of(st.none(), st.integers(0, 2**64 - 1)))
def test_fuzzed_request_never_disturbs_its_batch_mates(model, innocent_alone, temperature, top_p, top_k, penalty, min_new, seed):
    """Any sampling settings the API accepts: the fuzzed request ends cleanly, and the innocent requests
    batched with it produce exactly the tokens they produce alone."""
    from moss.speech.v1 import common_pb2

    from services.common.errors import InvalidArgument
    from services.common.sampling import resolve_sampling

    msg = common_pb2.SamplingParams(temperature=temperature, top_p=top_p, top_k=min(top_k, 2**31 - 1), repetition_penalty=penalty,
                                    max_new_tokens=12, min_new_tokens=min_new, **({} if seed is None else {"seed": seed}))
    try:
        fuzzed = resolve_sampling(msg, max_new_tokens_limit=64)
    except InvalidArgument:
        return  # refused up front with INVALID_ARGUMENT: also a clean outcome
    seqs, errors = generate(make_engine(model), INNOCENT + [fuzzed])
    assert errors == []
    assert all(0 <= a < CFG.audio_vocab_size for a in seqs[-1].audio_ids)
    assert seqs[-1].finish_reason in (FinishReason.LENGTH, FinishReason.END_OF_SPEECH)
    for seq, alone in zip(seqs, innocent_alone):
        assert seq.audio_ids == alone


class NaNForOne:
    """Wraps the real runner and poisons the audio logits of the request named `victim`."""

    def __init__(self, runner, victim):
        self.runner, self.victim = runner, victim

    def run(self, batch, feed=None):
        sampled, text, audio = self.runner.run(batch, feed)
        audio = audio.clone()
        for row, i in enumerate(sampled):
            if batch.seqs[i].request_id == self.victim:
                audio[row, 3] = float("nan")
        return sampled, text, audio


def test_a_request_whose_logits_fail_ends_alone(model, innocent_alone):
    engine = make_engine(model)
    engine.runner = NaNForOne(engine.runner, victim=str(len(INNOCENT)))
    seqs, errors = generate(engine, INNOCENT + [INNOCENT[0]])
    assert len(errors) == 1 and "not finite" in errors[0]
    assert seqs[-1].finish_reason is FinishReason.FAILED
    for seq, alone in zip(seqs, innocent_alone):
        assert seq.audio_ids == alone and seq.finish_reason is FinishReason.LENGTH
    assert engine.block_manager.num_used == 0 and len(engine.sampler.free_slots) == engine.config.max_num_seqs


def test_greedy_threshold_is_documented_in_the_proto():
    proto = open("protos/moss/speech/v1/common.proto").read()
    assert f"{GREEDY_BELOW:g}" in proto and not math.isnan(GREEDY_BELOW)


@pytest.mark.parametrize("vocab", [16512, 151680, 3000, 700])
def test_two_stage_top_candidates_equal_topk(vocab):
    g = torch.Generator().manual_seed(vocab)
    z = torch.randn(6, vocab, generator=g)
    z[0, : vocab - 10] = float("-inf")  # a row with fewer finite logits than a slice holds
    z[1, 5] = float("inf")
    vals, ids = top_candidates(z, 64)
    ref_vals, ref_ids = torch.topk(z, 64, dim=1)
    assert torch.equal(vals, ref_vals)
    finite = ref_vals > float("-inf")
    assert torch.equal(ids[finite], ref_ids[finite]) and (ids < vocab).all()


@pytest.mark.parametrize("case", range(4))
def test_fused_candidate_kernels_draw_what_the_torch_path_draws(case):
    """runner/kernels/sampling.py (Triton; the interpreter on CPU) against sample_rows over random logits
    with NaN, +inf and huge values, masked ranges, eosp blocking, seen tokens and every kind of setting."""
    from services.llm.runner.kernels.sampling import sample_candidates

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(case)
    n, vocab, slots = 16, (3000, 16512)[case % 2], 20
    limit, eosp = vocab - 100, vocab - 150
    logits = torch.randn(n, vocab, generator=g) * (1 + 4 * case)
    logits[0, 5] = float("nan")
    logits[1, 7] = float("inf")
    logits[2, limit + 3] = float("nan")  # masked: not a fault
    logits[3, :50] = 3e38
    logits[4, 9] = logits[4, 11] = logits[4].max() + 1  # a tie for the greedy pick
    seen = torch.rand(slots, vocab, generator=g) < 0.05
    r = RowSettings(
        temperature=torch.tensor([0.0, 1e-45, 0.3, 1.0, 2.0, 0.7, 1e-6, 0.9] * 2),
        top_p=torch.tensor([1.0, 0.5, 0.9, 1e-9, 0.99, 0.3, 1.0, 0.8] * 2),
        penalty=torch.tensor([1.0, 1e-45, 1.3, 10.0, 0.5, 1.0, 2.0, 1.1] * 2),
        top_k=torch.randint(1, TOPK_CAP // 2 + 1, (n,), generator=g),
        seed=torch.randint(-(2**62), 2**62, (n,), generator=g),
        step=torch.randint(0, 500, (n,), generator=g),
        slot=torch.randperm(slots, generator=g)[:n],
        block_eosp=torch.rand(n, generator=g) < 0.5,
    )
    masked = logits.clone()
    masked[:, limit:] = float("-inf")
    masked[:, eosp] = torch.where(r.block_eosp, float("-inf"), masked[:, eosp])
    ref_ids, ref_ok = sample_rows(masked, r, seen[r.slot], 12345, TOPK_CAP)
    on = lambda t: t.to(device)  # noqa: E731
    r_dev = RowSettings(*(on(getattr(r, f)) for f in RowSettings.__dataclass_fields__))
    ids, ok = sample_candidates(on(logits), on(seen), r_dev, 12345, TOPK_CAP, limit=limit, eosp=eosp)
    assert ok.cpu().tolist() == ref_ok.tolist()
    assert ids.cpu()[ref_ok].tolist() == ref_ids[ref_ok].tolist()
