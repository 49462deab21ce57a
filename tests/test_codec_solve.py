"""The flow's solve one Euler step at a time, each row at its own step (flow.py's solve_step): rows that join a solve
at different steps, in passes with whichever other rows are in flight, get what a whole call gives them, over the
voice prefix and over a stream history that holds earlier frames (tiny-codec layout, float32, random weights).
This is what batching the solve at the Euler step rests on (docs/codec.md: the next lever)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import interpreter_only

from services.vocoder.codec.decoder import FlowTokenDecoder
from services.vocoder.codec.history import HistoryRows

CPU = torch.device("cpu")


def codes(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 1024, n).tolist()


def decoder(flow, voices, **options) -> FlowTokenDecoder:
    d = FlowTokenDecoder(flow, CPU, prefix_min_rows=1, **options)
    d.set_voices(voices)
    return d


def staggered(flow, batch, cache, view_of, starts: list[int]) -> torch.Tensor:
    """Solve batch's rows one Euler step a pass, row i from pass starts[i] on, each pass over the rows then in flight
    only (gathered, then scattered back; view_of(idx): what those rows read of the cache, the prefix or history)
    → x [B, frames, 80]."""
    solver = flow.decoder
    mu, mask, spks, cond, noise_index, _ = flow.prepare(batch, True, cache)
    inputs, lengths = solver.start(mu, mask, spks, cond, noise_index)
    B, S = mu.shape[0], solver.n_timesteps
    for tick in range(max(starts) + S):
        rows = [i for i in range(B) if starts[i] <= tick < starts[i] + S]
        if not rows:
            continue
        idx = torch.tensor(rows)
        both = torch.cat([idx, idx + B])
        part = inputs[both].clone()
        steps = torch.tensor([tick - starts[i] for i in rows])
        solver.solve_step(part, mask[idx], lengths[both], steps, True, view_of(idx))
        inputs[both] = part
    return inputs[:B, :, : mu.shape[2]]


@pytest.mark.parametrize("starts", [[0, 0, 0], [0, 3, 7], [5, 0, 2]])
def test_rows_over_the_voice_prefix_joining_at_different_steps_get_the_whole_calls_mel(flow, voices, starts):
    d = decoder(flow, voices, history_streams=0)
    rows = []
    for i, (voice, n) in enumerate(((voices[0], 12), (voices[1], 19), (voices[0], 30))):
        state = dataclasses.replace(d.start(voice), tokens=tuple(codes(n, seed=i)))
        rows.append((state, d.plan(state, state.received, False)))
    T = max(len(s.voice.prompt_tokens) + p.end - p.start for s, p in rows)
    batch = d._batch(rows, len(rows), T, prefixed=True)
    with torch.inference_mode():
        want = flow(batch, streaming=True, prefix=d.prefix)                         # [B, 80, frames]
        got = staggered(flow, batch, d.prefix, lambda idx: d.prefix.view(batch.voice_index[idx]), starts)
    assert got.shape == (len(rows), want.shape[2], 80)
    torch.testing.assert_close(got.transpose(1, 2), want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("starts,products", [([0, 4, 9], "pytorch"), ([2, 0, 1], "pytorch"), pytest.param(
    [2, 0, 1], "folded", marks=interpreter_only)])  # (on a GPU: the solve in CUDA graphs)
def test_history_rows_joining_at_different_steps_get_the_whole_calls_mel(flow, voices, starts, products, monkeypatch):
    """Second calls of three streams (their rings and convolution banks hold their first calls' frames): each row
    reads its own ring and writes its new frames there at the step it is at. products "folded": through
    prefetch_linear's kernel with the per-frame work, the kept keys and the convolutions' kept frames folded in
    (Triton's interpreter), where each row's ring and bank row is at its own step."""
    d = decoder(flow, voices, history_streams=4)
    rows = []
    for i, voice in enumerate((voices[0], voices[1], voices[0])):
        tokens = codes(40, seed=10 + i)
        _, state = d.decode_chunks([(tokens[:12 + i], d.start(voice))])[0]           # its first call: a ring to read
        state = dataclasses.replace(state, tokens=state.tokens + tuple(tokens[12 + i : 32]))
        plan = d.plan(state, state.received, False, capped=True)
        assert state.slot is not None and state.slot >= 0 and state.written > 0 and plan is not None, state
        rows.append((state, plan))
    if products == "folded":  # the second calls only (the first ones fill the rings and banks either way)
        from services.vocoder.codec import prefetch_linear

        monkeypatch.setattr(prefetch_linear, "on_gpu", lambda x: True)
        monkeypatch.setattr(prefetch_linear, "TILE", (128, 64, 4))  # few programs: the interpreter runs each in turn
        monkeypatch.setattr(flow.decoder, "n_timesteps", 3)          # (5 passes, not 12: the interpreter's time)
    spans = [d._solved(s, p) for s, p in rows]
    T = max(len(s.voice.prompt_tokens) + p.end - p.start for s, p in rows)
    batch = d.history_batch(rows, len(rows), T, max(b - a for a, b, _ in spans))
    rings = [t.clone() for t in (d.history.keys, d.history.values)]

    def view_of(idx):
        part = HistoryRows(*(getattr(batch.history, f.name)[idx] for f in dataclasses.fields(HistoryRows)))
        return d.history.view(batch.voice_index[idx], part, batch.solve_frames[idx])

    with torch.inference_mode():
        want = flow(batch, streaming=True, prefix=d.history)                         # [B, 80, N]
        kept = [t.clone() for t in (d.history.keys, d.history.values)]
        d.history.keys.copy_(rings[0])
        d.history.values.copy_(rings[1])                                              # the rings as before the call
        got = staggered(flow, batch, d.history, view_of, starts)
    for row, (a, b, _) in enumerate(spans):
        torch.testing.assert_close(got[row, : b - a].t(), want[row, :, : b - a], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(d.history.keys, kept[0], atol=2e-5, rtol=1e-5)      # the same frames kept, by step
    torch.testing.assert_close(d.history.values, kept[1], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("starts", [[0, 3, 7], [0, 4, 4]])
def test_streams_through_a_running_solve_get_what_their_calls_give(flow, voices, starts):
    """Three streams' chunks (the gateway's 8, 5, 10, 20 tokens) admitted to one solve as they come, a stream's next
    chunk once its last has left, a tick's admissions in one batch, streams starting ticks apart: each chunk's mel is
    what decode_chunks gives it."""
    want = reference_chunks(flow, voices)
    got = solved_chunks(decoder(flow, voices, history_streams=4), voices, starts)
    assert set(got) == set(want)
    for key in want:
        assert got[key].shape == want[key].shape and want[key].shape[1] > 0, key
        torch.testing.assert_close(got[key], want[key], atol=2e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs: a GPU test")
def test_a_solve_in_cuda_graphs_is_the_eager_solve(flow, voices):
    """Ticks and admissions replayed from graphs (rows padded to batch buckets, the padding in the scratch place)
    give what the same solve gives eagerly, on the GPU in bf16."""
    from services.vocoder.codec.checkpoint import random_codec
    from services.vocoder.codec.config import tiny

    results = []
    for graphs in (False, True):
        d = FlowTokenDecoder(random_codec(tiny(), 0)[0].eval(), torch.device("cuda"), prefix_min_rows=1,
                             history_streams=4, graphs=graphs)
        d.set_voices(voices)
        results.append(solved_chunks(d, voices, [0, 4, 4]))
    assert set(results[1]) == set(results[0])
    for key, mel in results[0].items():
        got = results[1][key].float()
        assert got.shape == mel.shape
        assert float(10 * torch.log10(mel.float().pow(2).sum() / (got - mel.float()).pow(2).sum().clamp(min=1e-30))) > 30


SCHEDULE = [8 + 3, 5, 10, 20]     # (8 + 3: the tenor's first block is 8 tokens)


def speakers(voices):
    return [voices[0], voices[1], voices[0]]


def reference_chunks(flow, voices) -> dict:
    """(stream, chunk) → its mel through decode_chunks, each stream alone."""
    d, want = decoder(flow, voices, history_streams=4), {}
    for i, voice in enumerate(speakers(voices)):
        tokens, state, at = codes(60, seed=20 + i), d.start(voice), 0
        for k, n in enumerate(SCHEDULE):
            want[i, k], state = d.decode_chunks([(tokens[at : at + n], state)])[0]
            at += n
    return want


def solved_chunks(d: FlowTokenDecoder, voices, starts: list[int]) -> dict:
    """(stream, chunk) → its mel through one FlowSolve, stream i's first chunk admitted at tick starts[i]."""
    from services.vocoder.codec.solve import FlowSolve

    solve = FlowSolve(d, capacity=3)
    solve.warm_up()
    states = [d.start(v) for v in speakers(voices)]
    tokens = [codes(60, seed=20 + i) for i in range(3)]
    sent, busy, got = [0, 0, 0], [False] * 3, {}
    for tick in range(200):
        rows, tags = [], []
        for i in range(3):
            k = sent[i]
            if tick < starts[i] or busy[i] or k == len(SCHEDULE):
                continue
            at = sum(SCHEDULE[:k])
            state = dataclasses.replace(states[i], tokens=states[i].tokens + tuple(tokens[i][at : at + SCHEDULE[k]]))
            state = d._assign(state)
            plan = d.plan(state, state.received, False, capped=True)
            assert state.slot >= 0 and plan is not None
            rows.append((state, plan))
            tags.append((i, k))
            states[i], sent[i], busy[i] = d.advance(state, plan), k + 1, True
        if rows:
            solve.admit(rows, tags)
        for (i, k), mel in solve.tick():
            got[i, k], busy[i] = mel.cpu(), False
        if len(got) == 3 * len(SCHEDULE):
            break
    return got


def test_a_stream_cancelled_while_its_row_flies_keeps_its_slot_until_the_row_is_out(flow, voices):
    """A cancel (decoder.release) while the stream's row is in the solve: the slot stays the stream's while the solve
    writes it, and is free once the row leaves, dropped or solved; its place is free for the next admission."""
    from services.vocoder.codec.solve import FlowSolve

    d = decoder(flow, voices, history_streams=2)
    solve = FlowSolve(d, capacity=2)

    def admitted(voice, tag, seed):
        state = dataclasses.replace(d.start(voice), tokens=tuple(codes(11, seed=seed)))
        state = d._assign(state)
        solve.admit([(state, d.plan(state, state.received, False, capped=True))], [tag])
        return state

    first = admitted(voices[0], "dropped", 5)
    d.release(first)                                         # cancelled, its row in flight
    solve.tick()
    assert d.history.held == 1 and solve.room == 1
    assert solve.drop("dropped") and not solve.drop("dropped")
    assert d.history.held == 0 and solve.room == 2 and not solve.flight

    second = admitted(voices[1], "solved", 6)
    d.release(second)
    for _ in range(d.flow.decoder.n_timesteps - 1):
        assert solve.tick() == [] and d.history.held == 1
    [(tag, mel)] = solve.tick()
    assert tag == "solved" and mel.shape[1] > 0
    assert d.history.held == 0 and solve.room == 2


def test_only_history_rows_are_admitted(flow, voices):
    from services.vocoder.codec.solve import FlowSolve

    d = decoder(flow, voices, history_streams=1)
    state = dataclasses.replace(d.start(voices[0]), tokens=tuple(codes(11, seed=1)))   # no slot assigned yet
    with pytest.raises(ValueError, match="only stream-history rows"):
        FlowSolve(d, capacity=1).admit([(state, d.plan(state, state.received, False))], ["x"])
    with pytest.raises(ValueError, match="keeps no stream history"):
        FlowSolve(decoder(flow, voices, history_streams=0), capacity=1)
