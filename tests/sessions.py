"""Engine-level sessions as their caller keeps them: each session's history is its finished turns' turn_tokens
(each turn's final chunk carries them), joined, and goes with its next turn; the llm keeps none
(services/llm/engine/pins.py)."""

from __future__ import annotations

from services.common.sampling import ChunkSettings
from services.llm.engine.engine import GenerationRequest, LLMEngine
from services.llm.sequence import Chunk, Sequence


class Sessions:
    def __init__(self):
        self.history: dict[str, tuple[list[int], list[int]]] = {}  # session id → (text ids, audio ids)
        self.session_of: dict[int, str] = {}                        # seq_id → session id, while its turn runs

    def request(self, request_id: str, sampling, session_id: str, **kw) -> GenerationRequest:
        """A turn of the session, with the history kept so far (none before its first turn ended)."""
        text, audio = self.history.get(session_id, ([], []))
        return GenerationRequest(request_id, sampling, kw.pop("chunking", ChunkSettings()), session_id=session_id,
                                 history_text_ids=text or None, history_audio_ids=audio or None, **kw)

    def add(self, engine: LLMEngine, req: GenerationRequest) -> Sequence:
        seq = engine.make_sequence(req)
        engine.add(seq)
        self.session_of[seq.seq_id] = seq.session_id
        return seq

    def step(self, engine: LLMEngine) -> list[Chunk]:
        """One engine step; a session turn that ended joins its history."""
        chunks = engine.step()
        for chunk in chunks:
            if chunk.final and chunk.turn_tokens is not None:
                session = self.session_of.pop(chunk.seq_id)
                text, audio = self.history.get(session, ([], []))
                self.history[session] = (text + chunk.turn_tokens[0], audio + chunk.turn_tokens[1])
        return chunks

    def run(self, engine: LLMEngine) -> list[Chunk]:
        """Step until the engine is idle → every chunk."""
        chunks = []
        while engine.has_work():
            chunks += self.step(engine)
        return chunks

    def release_all(self, engine: LLMEngine) -> None:
        """Every session ended: what the engine pinned for them goes."""
        for session in self.history:
            engine.release_session(session)
