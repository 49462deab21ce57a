"""Voices a client may ask for: the names the vocoder has (its ListVoices: the codec decoder's voice files and those
made through the API, or "default" alone for the stand-in decoder), less the voices other API keys made
(voice_owners.py). The gateway asks each vocoder replica when it becomes ready (backends.py), and checks a turn's
voice against the replica the turn goes to before any stage works on it. A voice conditions the vocoder's flow
decoder only; the llm's system prompt is the session's or its default."""

from __future__ import annotations

from services.common.errors import InvalidArgument, echo, listed
from services.gateway.voice_owners import SHARED, VoiceOwners

DEFAULT = "default"


def resolve_voice(name: str, known: tuple[str, ...] | None, owners: VoiceOwners | None = None,
                  owner: str = SHARED) -> str:
    """→ the voice's name ("" is "default"), or InvalidArgument listing the ones `owner` may use (another key's voice
    is as unknown as one that is not there). known None: the vocoder did not say (it checks the name itself when its
    stream opens)."""
    name = name or DEFAULT
    usable = known if known is None or owners is None else owners.usable(known, owner)
    if (usable is not None and name not in usable) or (owners is not None and not owners.may_use(name, owner)):
        names = f"; known voices: {listed(sorted(usable))}" if usable is not None else ""
        raise InvalidArgument("voice", f"unknown voice {echo(name)}{names}")
    return name
