"""A child process that ends with its parent, however the parent ends (SIGKILL included).

Linux's PR_SET_PDEATHSIG has the kernel send the child a signal when its parent exits; a child that
finds its parent already gone (it died before the child could ask) exits at once. `moss-serve up` and the
test stacks name themselves in PARENT_ENV; each service calls `die_with_parent()` first thing. Elsewhere
than Linux this does nothing.

The kernel's "parent" is the thread that started the child: start services from a thread that lives as long
as they should (the main thread). One started from a worker thread (asyncio.to_thread) is signalled when
that thread ends.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PARENT_ENV = "MOSS_SERVE_PARENT_PID"
PR_SET_PDEATHSIG = 1


def _prctl():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """If PARENT_ENV names this process's parent: be sent `sig` when it exits (exit now if it has)."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    _prctl()(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != int(parent):  # the parent died before prctl: nobody would signal us
        os._exit(1)


def preexec_die_with_parent(sig: int = signal.SIGTERM):
    """A Popen preexec_fn doing the same for a child that is not ours (the MPS daemon). Only safe before the
    parent has threads: the child runs it between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()
    prctl = _prctl()  # looked up here: the child must not load libraries between fork and exec

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec
