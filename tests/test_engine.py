"""The llm engine on the tiny model: paged KV against a dense forward, concurrency, holds, preemption, chunking,
chunked prefill, the prefix cache, bad requests, the warm-up, and that blocks come back. The generation rules (the
modality state machine, the heads' masks, sampling) are test_generation_rules.py's."""

import pytest
import torch
from tiny_engine import CFG, GREEDY, make_engine, run, tiny_model

from services.common.errors import InvalidArgument
from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.engine.engine import GenerationRequest
from services.llm.engine.reference import dense_logits, traced_generation
from services.llm.sequence import FinishReason


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def test_paged_decoding_matches_a_dense_forward(model):
    """Every generated position's logits, computed incrementally through the paged cache, equal the
    logits of one dense forward over the final sequence (prompt of 140 tokens: 9 blocks of 16)."""
    engine = make_engine(model)
    seq = engine.make_sequence(GenerationRequest("a", GREEDY, ChunkSettings(), text="Hello there, how are you?"))
    step_logits = traced_generation(engine, seq)
    dense_t, dense_a = dense_logits(model, seq.text_ids, seq.audio_ids)
    assert len(seq) > 2 * engine.block_manager.block_size + 40 - 1
    for i, (t, a) in enumerate(step_logits):
        pos = seq.num_prompt - 1 + i
        mine, ref = (t, dense_t[pos]) if t is not None else (a, dense_a[pos])  # the head the mode samples
        torch.testing.assert_close(mine, ref, rtol=1e-4, atol=1e-4)
    # greedy tokens of the dense forward are the ones generated (audio mode: the audio head)
    gen_audio = seq.audio_ids[seq.num_prompt:]
    assert gen_audio == [int(dense_a[seq.num_prompt - 1 + i, : CFG.audio_logits_limit].argmax()) for i in range(len(gen_audio))]


def test_concurrent_requests_give_the_tokens_each_gives_alone(model):
    texts = ["hi", "a longer request about the weather today", "x" * 70]
    alone = [run(make_engine(model), [GenerationRequest(str(i), GREEDY, ChunkSettings(), text=t)])[0][0] for i, t in enumerate(texts)]
    together, _ = run(make_engine(model), [GenerationRequest(str(i), GREEDY, ChunkSettings(), text=t) for i, t in enumerate(texts)])
    for a, b in zip(alone, together):
        assert a.audio_ids == b.audio_ids and a.text_ids == b.text_ids


def test_a_held_request_gets_no_steps_keeps_its_blocks_and_says_the_same_once_released(model):
    texts = ["hi", "a longer request about the weather today"]
    alone = [run(make_engine(model), [GenerationRequest(str(i), GREEDY, ChunkSettings(), text=t)])[0][0] for i, t in enumerate(texts)]
    engine = make_engine(model)
    seqs = [engine.make_sequence(GenerationRequest(str(i), GREEDY, ChunkSettings(), text=t)) for i, t in enumerate(texts)]
    for seq in seqs:
        engine.add(seq)
    for _ in range(5):
        engine.step()
    assert engine.hold("0", True) and not engine.hold("nobody", True)
    engine.step()  # (a step launched ahead before the hold may still land)
    steps, blocks = seqs[0].num_steps, list(seqs[0].block_table)
    while not seqs[1].finished:
        engine.step()
    assert seqs[0].num_steps == steps and seqs[0].block_table == blocks  # held: no steps, its blocks kept
    assert not engine.has_work() and engine.load().held == 1 and engine.hold_seconds() == 0.0
    assert engine.hold("0", False) and engine.has_work()
    while engine.has_work():
        engine.step()
    assert [s.audio_ids for s in seqs] == [a.audio_ids for a in alone] and engine.load().held == 0


def greedy_requests(n: int, max_new: int = 40, prefix: str = "r") -> list[GenerationRequest]:
    return [GenerationRequest(f"{prefix}{i}", SamplingSettings(temperature=0.0, max_new_tokens=max_new, min_new_tokens=0),
                              ChunkSettings(), text=f"question number {i}") for i in range(n)]


def test_held_requests_take_no_running_place_from_requests_that_can_run(model):
    """Twice max_num_seqs held (clients that stopped reading), then requests that can run: these run to their end
    beside the held ones (no "cache full" with the pool nearly empty), and the held ones, released, say what they
    would have said alone."""
    held_reqs, others = greedy_requests(4, prefix="held"), greedy_requests(2, prefix="other")
    alone = {r.request_id: run(make_engine(model), [r])[0][0] for r in held_reqs + others}
    engine = make_engine(model, max_num_seqs=2)
    held = [engine.make_sequence(r) for r in held_reqs]
    for seq in held:
        engine.add(seq)
    while any(seq.num_steps < 3 for seq in held[:2]):
        engine.step()
    for seq in held:  # two running, two still waiting for a place
        assert engine.hold(seq.request_id, True)
    engine.step()  # (a step launched ahead before the holds may still land)
    assert engine.scheduler.running == [] and engine.load().held == 4 and not engine.has_work()
    assert all(seq.block_table for seq in held[:2]) and not any(seq.block_table for seq in held[2:])
    steps = [seq.num_steps for seq in held]
    seqs = [engine.make_sequence(r) for r in others]
    for seq in seqs:
        engine.add(seq)
    while engine.has_work():
        engine.step()
    assert all(seq.finished for seq in seqs) and [seq.num_steps for seq in held] == steps
    assert engine.load().running == 0 and engine.load().waiting == 0 and engine.load().held == 4
    for seq in held:
        engine.hold(seq.request_id, False)
    while engine.has_work():
        engine.step()
        assert len(engine.scheduler.running) <= 2
    for seq in held + seqs:
        assert (seq.text_ids, seq.audio_ids) == (alone[seq.request_id].text_ids, alone[seq.request_id].audio_ids)
    assert engine.block_manager.num_used == 0 and engine.load().held == 0


def test_held_requests_give_up_their_blocks_before_a_running_request_is_preempted(model):
    """A pool that fits two requests: two held ones keep theirs until a newcomer needs them; then the newest held
    gives its blocks up (not a running request), and recomputes them once released, saying the same."""
    prompts = [[i] + [7] * 30 + [CFG.sosp_token_id] for i in range(3)]  # 2 blocks each, ~4 at their end

    def requests():
        return [GenerationRequest(f"r{i}", SamplingSettings(temperature=0.0, max_new_tokens=40, min_new_tokens=0),
                                  ChunkSettings(), text_ids=p) for i, p in enumerate(prompts)]

    alone = [run(make_engine(model), [r])[0][0] for r in requests()]
    engine = make_engine(model, kv_cache_bytes=9 * 16 * CFG.kv_bytes_per_token, max_num_seqs=4)
    seqs = [engine.make_sequence(r) for r in requests()]
    for seq in seqs[:2]:
        engine.add(seq)
    while any(seq.num_steps < 20 for seq in seqs[:2]):
        engine.step()
    for seq in seqs[:2]:
        engine.hold(seq.request_id, True)
    engine.step()
    kept = [list(seq.block_table) for seq in seqs[:2]]
    assert all(kept) and engine.block_manager.num_free < 4
    engine.add(seqs[2])
    preempted = engine.scheduler.num_preemptions
    while engine.has_work():
        engine.step()
        assert seqs[2] in engine.scheduler.running or seqs[2].finished  # never preempted itself
    assert seqs[2].finished and engine.scheduler.num_preemptions > preempted
    assert seqs[0].block_table == kept[0] and not seqs[1].block_table  # the newest held gave its blocks up
    for seq in seqs[:2]:
        engine.hold(seq.request_id, False)
    while engine.has_work():
        engine.step()
    assert [(s.text_ids, s.audio_ids) for s in seqs] == [(a.text_ids, a.audio_ids) for a in alone]
    assert engine.block_manager.num_used == 0


def test_a_request_released_while_the_batch_is_full_runs_when_a_place_frees(model):
    engine = make_engine(model, max_num_seqs=1)
    first, second = (engine.make_sequence(r) for r in greedy_requests(2, max_new=20))
    engine.add(first)
    while first.num_steps < 2:
        engine.step()
    engine.hold(first.request_id, True)
    engine.add(second)
    while second.num_steps < 2:
        engine.step()
    engine.hold(first.request_id, False)  # the one place is second's: first waits, its blocks kept
    engine.step()
    assert engine.scheduler.running == [second] and first.block_table and engine.load().waiting == 1
    assert engine.hold_seconds() == 0.0
    while not second.finished:
        engine.step()
    engine.step()
    assert engine.scheduler.running == [first]
    while engine.has_work():
        engine.step()
    assert first.finished and engine.block_manager.num_used == 0


def test_blocks_return_after_finish_and_abort(model):
    engine = make_engine(model)
    seqs, _ = run(engine, [GenerationRequest("a", GREEDY, ChunkSettings(), text="hello")])
    assert engine.block_manager.num_used == 0 and seqs[0].finish_reason is FinishReason.LENGTH
    seq = engine.make_sequence(GenerationRequest("b", GREEDY, ChunkSettings(), text="hello"))
    engine.add(seq)
    engine.step()
    assert engine.block_manager.num_used > 0
    assert engine.abort(seq.seq_id)
    assert engine.block_manager.num_used == 0 and not engine.has_work()
    assert not engine.abort(seq.seq_id)


def test_preemption_recomputes_and_keeps_tokens(model):
    reqs = [GenerationRequest(str(i), GREEDY, ChunkSettings(), text=f"request {i}") for i in range(3)]
    roomy, _ = run(make_engine(model), reqs)
    small = make_engine(model, kv_cache_bytes=20 * 16 * CFG.kv_bytes_per_token)  # 20 blocks: not enough for 3
    tight, _ = run(small, [GenerationRequest(str(i), GREEDY, ChunkSettings(), text=f"request {i}") for i in range(3)])
    assert small.scheduler.num_preemptions > 0
    assert [s.audio_ids for s in roomy] == [s.audio_ids for s in tight]
    assert small.block_manager.num_used == 0


@pytest.mark.parametrize("policy, want", [
    (dict(first_chunk_tokens=2, second_chunk_tokens=2, chunk_tokens=7), [2, 2, 4, 7, 7, 3]),
    (dict(first_chunk_tokens=8, second_chunk_tokens=5, chunk_tokens=20), [8, 5, 10, 2]),   # the defaults
    (dict(first_chunk_tokens=3, second_chunk_tokens=4, chunk_tokens=6), [3, 4, 6, 6, 6]),
])
def test_chunks_follow_the_policy(model, policy, want):
    """The first size, the second, doubling from it up to chunk_tokens, the final flush."""
    s = SamplingSettings(temperature=0.0, max_new_tokens=25, min_new_tokens=0)
    _, chunks = run(make_engine(model), [GenerationRequest("a", s, ChunkSettings(**policy), text="hello")])
    sizes = [len(c.audio_tokens) for c in chunks]
    assert sizes == want
    assert chunks[0].first and chunks[-1].final and not any(c.final for c in chunks[:-1])
    assert chunks[-1].stats.audio_tokens == 25 and chunks[-1].stats.finish_reason is FinishReason.LENGTH


def test_bad_requests_are_refused_and_allocate_nothing(model):
    engine = make_engine(model, max_model_len=256)
    cases = [
        (GenerationRequest("a", GREEDY, ChunkSettings(), text="  "), "text"),
        (GenerationRequest("a", GREEDY, ChunkSettings(), text="x" * 300), "exceeds the context"),
        (GenerationRequest("a", GREEDY, ChunkSettings(), text_ids=[]), "tokens.text"),
        (GenerationRequest("a", GREEDY, ChunkSettings(), text_ids=[5, CFG.vocab_size]), "tokens.text"),
        (GenerationRequest("a", GREEDY, ChunkSettings(), text_ids=[5, 6], audio_ids=[1]), "tokens.audio"),
    ]
    for req, message in cases:
        with pytest.raises(InvalidArgument, match=message):
            engine.make_sequence(req)
    assert engine.block_manager.num_used == 0 and not engine.has_work()


def lengths_prompts(n: int) -> list[str]:
    words = "the quick brown fox jumps over a lazy dog while birds sing".split()
    return [" ".join(words[: 1 + i % len(words)]) * (1 + i // 4) for i in range(n)]


def test_chunked_prefill_matches_a_dense_forward(model):
    """A 140-token prompt prefilled 24 positions a step (6 chunks crossing 16-position blocks)."""
    engine = make_engine(model, max_num_batched_tokens=24, max_num_seqs=4)
    seq = engine.make_sequence(GenerationRequest("a", GREEDY, ChunkSettings(), text="Hello there, how are you?"))
    logits = traced_generation(engine, seq)
    assert engine.counters.steps >= 6 + 39
    dense_t, dense_a = dense_logits(model, seq.text_ids, seq.audio_ids)
    assert logits and all(a is not None for _, a in logits)  # an audio reply: the audio head every step
    for i, (t, a) in enumerate(logits):
        torch.testing.assert_close(a, dense_a[seq.num_prompt - 1 + i], rtol=1e-4, atol=1e-4)


def alone_and_together(model, reqs_factory, **engine_kw):
    alone = []
    for req in reqs_factory():
        seqs, _ = run(make_engine(model), [req])
        alone.append(seqs[0])
    engine = make_engine(model, **engine_kw)
    together, _ = run(engine, reqs_factory())
    return engine, alone, together


def test_sixteen_concurrent_greedy_requests_match_their_solo_runs(model):
    def reqs():
        return [GenerationRequest(f"r{i}", SamplingSettings(temperature=0.0, max_new_tokens=12 + i, min_new_tokens=0),
                                  ChunkSettings(), text=t) for i, t in enumerate(lengths_prompts(16))]

    engine, alone, together = alone_and_together(model, reqs, max_num_seqs=16, max_num_batched_tokens=128)
    assert len({len(s) for s in together}) > 8  # different lengths
    for a, b in zip(alone, together):
        assert (a.text_ids, a.audio_ids) == (b.text_ids, b.audio_ids), a.request_id
    assert engine.block_manager.num_used == 0 and engine.scheduler.num_preemptions == 0


def test_sixteen_concurrent_requests_survive_preemption(model):
    rng = torch.Generator().manual_seed(5)
    prompts = [[i] + torch.randint(0, 256, (20 + 3 * i,), generator=rng).tolist() + [CFG.sosp_token_id] for i in range(16)]

    def reqs():  # token prompts without a shared prefix, each growing by 24 positions
        return [GenerationRequest(f"r{i}", SamplingSettings(temperature=0.0, max_new_tokens=24, min_new_tokens=0),
                                  ChunkSettings(), text_ids=p) for i, p in enumerate(prompts)]

    # 30 blocks of 16 positions; the 16 requests need about 80 at their longest
    engine, alone, together = alone_and_together(model, reqs, max_num_seqs=16, max_num_batched_tokens=256,
                                                 kv_cache_bytes=30 * 16 * CFG.kv_bytes_per_token)
    assert engine.scheduler.num_preemptions > 0
    for a, b in zip(alone, together):
        assert (a.text_ids, a.audio_ids) == (b.text_ids, b.audio_ids), a.request_id
    assert engine.block_manager.num_used == 0


def test_shared_system_prompt_is_computed_once(model):
    engine = make_engine(model)
    first, _ = run(engine, [GenerationRequest("a", GREEDY, ChunkSettings(), text="first question")])
    before = engine.counters.prefill_tokens
    seqs, _ = run(engine, [GenerationRequest("b", GREEDY, ChunkSettings(), text="second question")])
    computed = engine.counters.prefill_tokens - before
    common = next(i for i, (x, y) in enumerate(zip(first[0].text_ids, seqs[0].text_ids)) if x != y)
    assert common > 100  # system turn and "<|im_start|>user\n"
    assert engine.block_manager.hit_tokens == common // 16 * 16
    assert computed == seqs[0].num_prompt - engine.block_manager.hit_tokens
    cold, _ = run(make_engine(model), [GenerationRequest("b", GREEDY, ChunkSettings(), text="second question")])
    assert cold[0].audio_ids == seqs[0].audio_ids


def test_prefill_does_not_stall_decoding_streams(model):
    """A long prompt arriving mid-stream is prefilled in budget-sized chunks: the running stream
    gets a token every step meanwhile."""
    engine = make_engine(model, max_num_batched_tokens=32, max_model_len=2048)
    greedy = SamplingSettings(temperature=0.0, max_new_tokens=60, min_new_tokens=0)
    talking = engine.make_sequence(GenerationRequest("talk", greedy, ChunkSettings(), text="hi"))
    engine.add(talking)
    while talking.num_steps < 3:
        engine.step()
    engine.add(engine.make_sequence(GenerationRequest("long", GREEDY, ChunkSettings(), text="y" * 600)))
    steps_before = talking.num_steps
    for _ in range(10):
        batch_tokens = engine.scheduler.max_num_batched_tokens
        engine.step()
        assert engine.last_step.prefill_tokens <= batch_tokens
    assert talking.num_steps == steps_before + 10


def test_preemption_takes_the_newest_and_a_readmitted_request_keeps_its_place(model):
    engine = make_engine(model, kv_cache_bytes=8 * 16 * CFG.kv_bytes_per_token, max_num_seqs=4)
    prompts = [[i] + [7] * 30 + [CFG.sosp_token_id] for i in range(3)]  # 2 blocks each
    seqs = [engine.make_sequence(GenerationRequest(f"r{i}", SamplingSettings(temperature=0.0, max_new_tokens=60, min_new_tokens=0),
                                                   ChunkSettings(), text_ids=p)) for i, p in enumerate(prompts)]
    for s in seqs:
        engine.add(s)
    order = []
    while engine.has_work():
        before = engine.scheduler.num_preemptions
        running = list(engine.scheduler.running)
        engine.step()
        if engine.scheduler.num_preemptions > before:
            victims = [s for s in running if s not in engine.scheduler.running and not s.finished]
            order += [s.request_id for s in victims]
        assert [s.arrival for s in engine.scheduler.running] == sorted(s.arrival for s in engine.scheduler.running)
    assert order and "r0" not in order  # the oldest request is never the one preempted
    assert all(s.finish_reason is FinishReason.LENGTH for s in seqs) and engine.block_manager.num_used == 0


def test_warm_up_leaves_nothing_behind_and_the_engine_serves_as_before(model):
    """The synthetic turns run to completion (text and audio replies, prefix hits, batches up to
    max_num_seqs, streams joining a decoding batch) and leave no sequence, block in use or count; a request
    afterwards generates exactly what it does on a fresh engine (greedy)."""
    from services.llm.engine.warmup import warm_up

    engine = make_engine(model, max_num_seqs=8)
    mixed, record = [], engine.record  # which steps computed prefill and decode positions together
    engine.record = lambda stats, *args: (mixed.append(stats.prefill_tokens > 0 and stats.decode_tokens > 0),
                                          record(stats, *args))
    assert warm_up(engine, rounds=(1, 2, 9), new_tokens=3) > 1 + 2 + 8 + 1  # joins capped at max_num_seqs
    assert any(mixed) and not any(mixed[:3])  # the staggered joins mix them; the first rounds do not
    del engine.record
    assert not engine.has_work() and not engine.sequences and engine.block_manager.num_used == 0
    assert engine.counters.steps == 0 and engine.counters.prefill_tokens == 0
    req = GenerationRequest("after", GREEDY, ChunkSettings(), text="Hello after the warm-up")
    warmed, _ = run(engine, [req])
    fresh, _ = run(make_engine(model, max_num_seqs=8), [req])
    assert warmed[0].audio_ids == fresh[0].audio_ids and warmed[0].text_ids == fresh[0].text_ids
