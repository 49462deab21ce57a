"""Voices a client may ask for. A voice sets the system prompt of the turn; speaker conditioning of
the vocoder comes with the codec's speaker embedding (later)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.errors import InvalidArgument


@dataclass(frozen=True)
class Voice:
    name: str
    system_prompt: str = ""  # empty: the llm's default spoken-assistant prompt


VOICES = {"default": Voice("default")}


def resolve_voice(name: str) -> Voice:
    voice = VOICES.get(name or "default")
    if voice is None:
        raise InvalidArgument("voice", f"unknown voice {name!r}; known voices: {', '.join(sorted(VOICES))}")
    return voice
