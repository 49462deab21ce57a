"""Engine runs with mode switches and stops forced at chosen positions, for comparing two ways of running
the same requests (one step at a time or overlapped, with or without the text branch skipped).

A runner wrapper raises one logit of a row by the row's *position* (not by a step count, which a step
launched ahead sees one step early), so both ways of running see the same forcing.
"""

from __future__ import annotations

from sessions import Sessions

from services.common.sampling import SamplingSettings
from services.llm.engine.engine import EngineConfig, LLMEngine
from services.llm.model.config import tiny_config
from services.llm.model.tokenizer import tiny_tokenizer
from services.llm.sequence import Mode

CFG = tiny_config()
GREEDY = SamplingSettings(temperature=0.0, repetition_penalty=4.0, max_new_tokens=30, min_new_tokens=0)
SEEDED = SamplingSettings(temperature=0.05, top_k=20, top_p=0.9, repetition_penalty=10.0, max_new_tokens=30,
                          min_new_tokens=0, seed=11)


class Forcing:
    """Wraps a runner; for the sequence of request `r`, at generated offset k (the token at position
    num_prompt + k), raises the logit named by forces[r][k]: "sosp" or "stop" (text head), "eosp"
    (audio head). Every row also favours repeating its input token (the previous sample), so that a
    repetition penalty that missed the previous sample would show."""

    def __init__(self, runner, forces: dict[str, dict[int, str]], echo: float = 3.0):
        self.runner, self.forces, self.echo = runner, forces, echo

    def copy_blocks(self, copies):
        self.runner.copy_blocks(copies)

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
                text[t, previous[0]] += self.echo
                if force in ("sosp", "stop"):
                    text[t, CFG.sosp_token_id if force == "sosp" else CFG.stop_token_ids[0]] += 1e4
                t += 1
            else:
                audio[a, previous[1]] += self.echo
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


def make_engine(model, runner: str, echo: float = 3.0, **kw) -> LLMEngine:
    config = EngineConfig(**{"kv_cache_bytes": 1 << 22, "max_num_seqs": 8, "max_num_batched_tokens": 64,
                             "runner": runner, **kw})
    engine = LLMEngine(model, tiny_tokenizer(CFG), config)
    engine.runner = Forcing(engine.runner, FORCES, echo)
    return engine


def converse(engine: LLMEngine, turns=TURNS, sessions: Sessions | None = None) -> list:
    """All sessions' turns batched together, turn by turn, each with its session's history (`sessions` keeps
    them) → per session, per turn: (text ids, audio ids, finish reason) of the reply."""
    sessions = sessions if sessions is not None else Sessions()
    out = [[] for _ in turns]
    for t in range(max(len(s) for s in turns)):
        seqs = []
        for i, session in enumerate(turns):
            if t < len(session):
                req = sessions.request(f"{i}.{t}", GREEDY if i % 2 == 0 else SEEDED, f"s{i}", text=session[t],
                                       audio_reply=i == 2)
                seqs.append((i, sessions.add(engine, req)))
        sessions.run(engine)
        for i, seq in seqs:
            out[i].append((seq.text_ids[seq.num_prompt :], seq.audio_ids[seq.num_prompt :], seq.finish_reason))
    return out
