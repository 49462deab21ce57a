"""Our engine timed through its public API (LLMEngine.step()), for bench/llm_engine.py: its paged logits checked
against one dense forward, fresh random prompts, a prefill alone in its step, and decode steps of B sequences
back to back (bench/llm_engine.py's docstring says how each is measured)."""

from __future__ import annotations

import statistics
import time

import torch

from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.engine.engine import GenerationRequest
from services.llm.engine.reference import dense_logits, traced_generation

try:
    from bench.measure import sync
except ImportError:  # run as a script: bench/ itself is on sys.path
    from measure import sync


# ---- correctness ----------------------------------------------------------------------------------------------

def check_paged_against_dense(model, engine, prompt_len: int, steps: int, device) -> float:
    """Max relative error of the logits of `steps` incremental positions vs one dense forward."""
    cfg = model.cfg
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, min(cfg.vocab_size, 150000), (prompt_len,), generator=g).tolist()
    greedy = SamplingSettings(temperature=0.0, repetition_penalty=1.0, max_new_tokens=steps, min_new_tokens=steps)
    seq = engine.make_sequence(GenerationRequest("check", greedy, ChunkSettings(), text_ids=text + [cfg.sosp_token_id]))
    got = traced_generation(engine, seq)
    dense_t, dense_a = dense_logits(model, seq.text_ids, seq.audio_ids)
    worst, compared = 0.0, 0
    for i, (t, a) in enumerate(got):
        pos = seq.num_prompt - 1 + i
        for mine, ref in ((t, dense_t[pos]), (a, dense_a[pos])):
            if mine is None:  # the engine computes only the head its mode samples
                continue
            compared += 1
            assert torch.isfinite(mine).all(), "non-finite logits"
            worst = max(worst, float((mine - ref).norm() / ref.norm()))
    assert compared >= steps, f"only {compared} logit vectors to compare for {steps} steps"
    assert engine.block_manager.num_used == 0
    return worst


# ---- ours -----------------------------------------------------------------------------------------------------

class Prompts:
    """Fresh random prompts of a given number of positions: (n-1) random ids, then sosp."""

    def __init__(self, cfg, seed: int = 1):
        self.cfg = cfg
        self.limit = min(cfg.vocab_size, 150000, cfg.endoftext_token_id)  # below every special token
        self.g = torch.Generator().manual_seed(seed)
        self.count = 0

    def request(self, positions: int, new_tokens: int, name: str = "r") -> GenerationRequest:
        self.count += 1
        text = torch.randint(0, self.limit, (positions - 1,), generator=self.g).tolist() + [self.cfg.sosp_token_id]
        s = SamplingSettings(temperature=0.6, max_new_tokens=new_tokens, min_new_tokens=new_tokens, seed=self.count)
        return GenerationRequest(f"{name}{self.count}", s, ChunkSettings(), text_ids=text)


def timed_step(engine, device) -> float:
    sync(device)
    t = time.perf_counter()
    engine.step()
    sync(device)
    return time.perf_counter() - t


def running_seqs(engine) -> list:
    return list(engine.scheduler.running)


def all_decoding(engine, batch: int) -> bool:
    """True when the next step is a pure decode step of `batch` sequences (num_cached == len(s) when a
    step launched ahead already computes the position of a sample the host has not applied yet)."""
    run = running_seqs(engine)
    return (not engine.scheduler.waiting and len(run) == batch
            and all(s.num_steps > 0 and len(s) - 1 <= s.num_cached <= len(s) for s in run))


def abort_all(engine) -> None:
    for seq_id in list(engine.sequences):
        engine.abort(seq_id)


def time_prefill(engine, prompts: Prompts, positions: int, reps: int, device, time_left) -> dict:
    """One request of `positions` positions alone in its step: warm-up, then the median of `reps`."""
    times = []
    for i in range(1 + reps):
        if time_left() <= 0 and len(times) >= 1:
            break
        engine.add(engine.make_sequence(prompts.request(positions, 1, "p")))
        dt = timed_step(engine, device)
        st = engine.last_step
        if st.prefill_tokens != positions or st.batch_size != 1:
            raise RuntimeError(f"prefill step computed {st.prefill_tokens} positions for {st.batch_size} sequences, "
                               f"expected {positions} for 1")
        if engine.has_work():  # a one-token request ends with its prefill step
            abort_all(engine)
            raise RuntimeError("the prefill request did not finish in its step")
        if i > 0:
            times.append(dt)
    return {"positions": positions, "ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3,
            "reps": len(times)}


def time_decode(engine, prompts: Prompts, batch: int, context: int, steps: int, warmup: int, new_tokens: int,
                device, time_left) -> dict:
    """B sequences at context C, all decoding: median step time over `steps` pure decode steps."""
    t_fill = time.perf_counter()
    for _ in range(batch):
        engine.add(engine.make_sequence(prompts.request(context, new_tokens, "d")))
    fill_steps = 0
    try:
        while not all_decoding(engine, batch):
            if time_left() <= 0:
                raise TimeoutError(f"time guard while filling ({fill_steps} steps)")
            if not engine.has_work():
                raise RuntimeError("the sequences finished before all were decoding")
            engine.step()
            fill_steps += 1
        sync(device)
        fill_s = time.perf_counter() - t_fill
        # Steps back to back, as a stream sees them (a sync per step would undo the engine's overlap of
        # host work with the GPU): the mean over the timed run, and each step() call's time (no sync).
        times, contexts, note = [], [], ""
        for i in range(warmup + steps):
            if i == warmup:
                sync(device)
                t_run = time.perf_counter()
            if time_left() <= 0:
                note = f"time guard after {len(times)} timed steps"
                break
            attended = sum(len(s) for s in running_seqs(engine))  # positions each sequence attends, this step
            t = time.perf_counter()
            engine.step()
            dt = time.perf_counter() - t
            st = engine.last_step
            if st.prefill_tokens or st.batch_size != batch or st.decode_tokens != batch:
                note = (f"step {i} was not a pure decode step of {batch} (batch {st.batch_size}, decode "
                        f"{st.decode_tokens}, prefill {st.prefill_tokens}, preemptions {st.preemptions}); stopped")
                break
            if i >= warmup:
                times.append(dt)
                contexts.append(attended)
        sync(device)
        run_s = time.perf_counter() - t_run if times else 0.0
        if len(times) < 3:
            raise (TimeoutError if note.startswith("time guard") else RuntimeError)(note or "no step timed")
    finally:
        abort_all(engine)
    return {"batch": batch, "context": context, "ms": run_s / len(times) * 1e3, "median_call_ms": statistics.median(times) * 1e3,
            "min_ms": min(times) * 1e3, "max_ms": max(times) * 1e3, "steps": len(times), "warmup": warmup, "fill_steps": fill_steps,
            "fill_seconds": fill_s, "mean_attended_positions": statistics.fmean(contexts) / batch,
            "attended_positions_per_step": statistics.fmean(contexts), "note": note}
