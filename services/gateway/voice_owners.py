"""Who each voice made through the API belongs to, kept by the gateway outside the voices' files (the vocoders know
no keys): a voice made with an API key is that key's alone; one made without a key (a gateway without keys) is
everyone's; a voice not recorded here is one of the vocoders' own (their voices directory: the operator's) and
everyone's too.

An owner is a key's digest (admission.client_id's "key:<sha256 prefix>"): keys are never kept. The record is a JSON
file (--voice-owners), rewritten whole on each change (a new file renamed over the old), so that a gateway that
restarts still keeps each key's voices from the others; without a file it lives as long as the gateway. Gateways in
front of the same vocoders share one file: each change is made under a lock on it (read, changed, written), and a
gateway reads it again when it has changed (looked at once every FRESH_SECONDS at most).

    {"voices": {"<name>": "<owner, or '' for everyone>", ...}}
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

SHARED = ""  # the owner of a voice made without a key
FRESH_SECONDS = 0.5  # how stale a gateway's copy of a shared file may be


def owner_of(client: str | None) -> str:
    """The owner a caller's voices get: its key's digest, or SHARED for a caller without a key (an address, or this
    host: admission.client_id)."""
    return client if client is not None and client.startswith("key:") else SHARED


class VoiceOwners:
    def __init__(self, path: str | Path | None = None):
        """path: the JSON file the owners are kept in (read now if it exists); None: memory only."""
        self.path = Path(path) if path is not None else None
        self._owners: dict[str, str] = {}
        self._stamp: tuple[int, int] | None = None  # the file's (mtime, size) when last read
        self._looked = 0.0
        if self.path is not None:
            self._read()

    @property
    def owners(self) -> dict[str, str]:
        """name → owner, as the file says now (read again if another gateway changed it)."""
        if self.path is not None and time.monotonic() - self._looked >= FRESH_SECONDS:
            try:
                self._read()
            except ValueError as err:  # (a file spoilt by hand while serving: the last good copy goes on)
                log.warning("gateway: %s; keeping the voice owners read before", err)
        return self._owners

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
        owners = self.owners
        return tuple(n for n in names if owners.get(n, SHARED) in (SHARED, owner))

    def count(self, owner: str) -> int:
        """Voices the owner has made (and not deleted)."""
        return sum(1 for o in self.owners.values() if o == owner)

    def record(self, name: str, owner: str) -> None:
        self._change(lambda owners: owners.__setitem__(name, owner))

    def forget(self, name: str) -> None:
        self._change(lambda owners: owners.pop(name, None))

    # ---- the file ------------------------------------------------------------------------------------------------
    def _change(self, change) -> None:
        """Apply `change` to the owners as the file holds them now, and write them back, all under the file's lock."""
        if self.path is None:
            change(self._owners)
            return
        with self._locked():
            self._read(force=True)
            change(self._owners)
            part = self.path.with_name(f".{self.path.name}.part")
            part.write_text(json.dumps({"voices": self._owners}, indent=1, sort_keys=True))
            os.chmod(part, 0o600)
            part.replace(self.path)
            self._read(force=True)

    def _read(self, force: bool = False) -> None:
        self._looked = time.monotonic()
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._owners, self._stamp = {}, None
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp and not force:
            return
        try:
            data = json.loads(self.path.read_text())
            self._owners = {str(k): str(v) for k, v in data["voices"].items()}
        except (OSError, ValueError, KeyError, AttributeError) as err:
            raise ValueError(f"--voice-owners {self.path}: not a voice owners file ({err})") from None
        self._stamp = stamp

    @contextlib.contextmanager
    def _locked(self):
        lock = self.path.with_name(f".{self.path.name}.lock")
        with open(lock, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
