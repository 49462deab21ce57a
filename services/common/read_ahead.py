"""What a service reads on the CPU before it touches its device, read ahead by its spare (services/spare.py) and kept
here for the service's start to take, once.

After a fault every GPU stage starts at once, and what each builds on the CPU then (a codec's modules, an encoder's
weights) competes with the others' starts for the host's cores. A spare, which must not touch the GPU before it serves,
can do that work while it waits: the start then only moves the modules to the device. On an H200 the vocoder's codec
took 3.5 s of its 17.5 s back beside the others' starts (docs/benchmarks.md, fault-2026-11-30)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class ReadAhead(Generic[T]):
    """By key (the arguments that say what to read): what was read ahead, until a start takes it."""

    def __init__(self, what: str):
        """what: what is read, for the log line of a start that takes it ("the vocoder's codec")."""
        self.what = what
        self.kept: dict[Hashable, T] = {}

    def read(self, key: Hashable, build: Callable[[], T | None]) -> bool:
        """Read now unless kept already → whether there is one kept (build() returns None: nothing to read)."""
        if key not in self.kept and (value := build()) is not None:
            self.kept[key] = value
        return key in self.kept

    def take(self, key: Hashable, build: Callable[[], T | None]) -> T | None:
        """The one read ahead for `key` (taken: once), else build() now."""
        value = self.kept.pop(key, None)
        if value is None:
            return build()
        log.info("%s was read ahead (a spare's)", self.what)
        return value
