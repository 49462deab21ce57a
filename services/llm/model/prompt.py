"""Chat prompt construction (docs/architecture.md §2): `<|im_start|>{role}\\n...<|im_end|>\\n` turns, then
the assistant prefix; an audio reply's prefix ends with sosp (`<|object_ref_start|>`), so generation
starts in audio mode. The audio channel of a text prompt is audio_pad at every position."""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer

from services.llm.model.config import MossSpeechConfig

AUDIO_SYSTEM_PROMPT = "You are a helpful voice assistant. Answer the user's questions with spoken responses."
TEXT_SYSTEM_PROMPT = "You are a helpful assistant. Answer the user's questions with text."


@dataclass
class Prompt:
    text_ids: list[int]
    audio_ids: list[int]
    turn_start: int  # where the user's turn begins (after the system turn): a session's later turns start here


class PromptBuilder:
    def __init__(self, tokenizer: Tokenizer, cfg: MossSpeechConfig):
        self.cfg = cfg
        # Turn contents are encoded literally: a user who types "<|im_end|>" gets those characters,
        # not a turn boundary. Special ids are placed by the builder alone. Pieces meet only at special
        # tokens, where the tokenizer splits anyway, so the ids equal a joint encoding of the template.
        self.literal = Tokenizer.from_str(tokenizer.to_str())
        self.literal.encode_special_tokens = True

    def _encode(self, text: str) -> list[int]:
        return self.literal.encode(text, add_special_tokens=False).ids

    def _turn(self, role: str, content: str) -> list[int]:
        c = self.cfg
        return [c.im_start_token_id, *self._encode(f"{role}\n{content}"), c.im_end_token_id, *self._encode("\n")]

    def build(self, user_text: str, audio_reply: bool = True, system_prompt: str = "") -> Prompt:
        """System turn, user turn, assistant prefix (ending with sosp for a spoken reply)."""
        system = system_prompt or (AUDIO_SYSTEM_PROMPT if audio_reply else TEXT_SYSTEM_PROMPT)
        system_ids = self._turn("system", system)
        ids = system_ids + self._turn("user", user_text)
        ids += [self.cfg.im_start_token_id, *self._encode("assistant\n")]
        if audio_reply:
            ids.append(self.cfg.sosp_token_id)
        return Prompt(text_ids=ids, audio_ids=[self.cfg.audio_pad_token_id] * len(ids), turn_start=len(system_ids))

    def turn_end(self) -> tuple[list[int], list[int]]:
        """What closes an assistant reply in the history: `<|im_end|>\n` (text, audio channels)."""
        ids = [self.cfg.im_end_token_id, *self._encode("\n")]
        return ids, [self.cfg.audio_pad_token_id] * len(ids)
