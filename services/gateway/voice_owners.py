"""Who each voice made through the API belongs to, kept by the gateway outside the voices' files (the vocoders know
no keys): a voice made with an API key is that key's alone; one made without a key (a gateway without keys) is
everyone's; a voice not recorded here is one of the vocoders' own (their voices directory: the operator's) and
everyone's too.

An owner is a key's digest (admission.client_id's "key:<sha256 prefix>"): keys are never kept. The record is a JSON
file (--voice-owners), rewritten whole on each change (a new file renamed over the old), so that a gateway that
restarts still keeps each key's voices from the others; without a file it lives as long as the gateway.

    {"voices": {"<name>": "<owner, or '' for everyone>", ...}}
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

SHARED = ""  # the owner of a voice made without a key


def owner_of(client: str | None) -> str:
    """The owner a caller's voices get: its key's digest, or SHARED for a caller without a key (an address, or this
    host: admission.client_id)."""
    return client if client is not None and client.startswith("key:") else SHARED


class VoiceOwners:
    def __init__(self, path: str | Path | None = None):
        """path: the JSON file the owners are kept in (read now if it exists); None: memory only."""
        self.path = Path(path) if path is not None else None
        self.owners: dict[str, str] = {}
        if self.path is not None and self.path.exists():
            try:
                data = json.loads(self.path.read_text())
                self.owners = {str(k): str(v) for k, v in data["voices"].items()}
            except (OSError, ValueError, KeyError, AttributeError) as err:
                raise ValueError(f"--voice-owners {self.path}: not a voice owners file ({err})") from None

    def owner(self, name: str) -> str | None:
        """Whose the voice is (SHARED: everyone's); None: one of the vocoders' own."""
        return self.owners.get(name)

    def made(self, name: str) -> bool:
        """Whether the voice was made through the API (else: one of the vocoders' own)."""
        return name in self.owners

    def may_use(self, name: str, owner: str) -> bool:
        """Whether a caller (owner_of) may name, list or see the voice: one of the vocoders' own, everyone's, or its
        own."""
        return self.owners.get(name, SHARED) in (SHARED, owner)

    def usable(self, names: Iterable[str], owner: str) -> tuple[str, ...]:
        return tuple(n for n in names if self.may_use(n, owner))

    def count(self, owner: str) -> int:
        """Voices the owner has made (and not deleted)."""
        return sum(1 for o in self.owners.values() if o == owner)

    def record(self, name: str, owner: str) -> None:
        self.owners[name] = owner
        self._save()

    def forget(self, name: str) -> None:
        if self.owners.pop(name, None) is not None:
            self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        part = self.path.with_name(f".{self.path.name}.part")
        part.write_text(json.dumps({"voices": self.owners}, indent=1, sort_keys=True))
        os.chmod(part, 0o600)
        part.replace(self.path)
