"""Chat prompt construction (docs/architecture.md §2): `<|im_start|>{role}\\n...<|im_end|>\\n` turns, then
the assistant prefix; an audio reply's prefix ends with sosp (`<|object_ref_start|>`), so generation
starts in audio mode. The audio channel of text is audio_pad at every position.

A spoken user turn is laid out as MOSS-Speech lays out any audio segment (its processor; the reply's own audio
has the same layout in the history):

    text channel   <|im_start|> user \\n  sosp       modality_pad ... modality_pad  modality_pad  <|im_end|> \\n
    audio channel  audio_pad ...          audio_pad  code_1 ...      code_n        eosp          audio_pad ...

The model reads the audio channel wherever the text channel holds modality_pad (the codes, then eosp), and the
text channel elsewhere."""

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

    def _spoken_turn(self, role: str, codes: list[int]) -> tuple[list[int], list[int]]:
        """A turn of audio codes → (text channel, audio channel): module docstring."""
        c = self.cfg
        head, tail = [c.im_start_token_id, *self._encode(f"{role}\n")], [c.im_end_token_id, *self._encode("\n")]
        text = head + [c.sosp_token_id] + [c.modality_pad_token_id] * (len(codes) + 1) + tail
        audio = [c.audio_pad_token_id] * (len(head) + 1) + list(codes) + [c.eosp_token_id] + [c.audio_pad_token_id] * len(tail)
        return text, audio

    def build(self, user: str | list[int], audio_reply: bool = True, system_prompt: str = "") -> Prompt:
        """System turn, user turn (its text, or its audio codes), assistant prefix (ending with sosp for a spoken
        reply)."""
        pad = self.cfg.audio_pad_token_id
        system = system_prompt or (AUDIO_SYSTEM_PROMPT if audio_reply else TEXT_SYSTEM_PROMPT)
        system_ids = self._turn("system", system)
        if isinstance(user, str):
            user_text = self._turn("user", user)
            user_audio = [pad] * len(user_text)
        else:
            user_text, user_audio = self._spoken_turn("user", user)
        prefix = [self.cfg.im_start_token_id, *self._encode("assistant\n")] + ([self.cfg.sosp_token_id] if audio_reply else [])
        return Prompt(text_ids=system_ids + user_text + prefix,
                      audio_ids=[pad] * len(system_ids) + user_audio + [pad] * len(prefix), turn_start=len(system_ids))

    def turn_end(self) -> tuple[list[int], list[int]]:
        """What closes an assistant reply in the history: `<|im_end|>\n` (text, audio channels)."""
        ids = [self.cfg.im_end_token_id, *self._encode("\n")]
        return ids, [self.cfg.audio_pad_token_id] * len(ids)
