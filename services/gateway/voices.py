"""Voices a client may ask for: the names the vocoder has (its ListVoices: the codec decoder's voice files, or
"default" alone for the stand-in decoder). The gateway asks each vocoder replica when it becomes ready
(backends.py), and checks a turn's voice against the replica the turn goes to before any stage works on it.
A voice conditions the vocoder's flow decoder only; the llm's system prompt is the session's or its default."""

from __future__ import annotations

from services.common.errors import InvalidArgument, echo, listed

DEFAULT = "default"


def resolve_voice(name: str, known: tuple[str, ...] | None) -> str:
    """→ the voice's name ("" is "default"), or InvalidArgument listing the known ones. known None: the vocoder
    did not say (it checks the name itself when its stream opens)."""
    name = name or DEFAULT
    if known is not None and name not in known:
        raise InvalidArgument("voice", f"unknown voice {echo(name)}; known voices: {listed(sorted(known))}")
    return name
