"""Typed errors raised anywhere in the services; services/common/interceptor.py maps them to gRPC
status codes in one place. Nothing here imports grpc, so engines can raise them freely.

Every door sends an error's `str()` to its client, so it is bounded: a client's own value is quoted by `echo` (cut to
ECHO_CHARS characters, its length named) where a message names it, and a message is cut to MAX_MESSAGE_BYTES of UTF-8
whatever went into it (gRPC's status message travels in a header, under a limit of its own: a 15 kB echo there once
ended a call RESOURCE_EXHAUSTED instead of with its own status)."""

from __future__ import annotations

from collections.abc import Iterable

ECHO_CHARS = 64
MAX_MESSAGE_BYTES = 1000
MAX_FIELD_CHARS = 128  # a field's path: ours, but a JSON body's unknown field is named by the client
LISTED = 16            # names a message lists (known voices, ...), at most


def echo(value: object) -> str:
    """A client's value, quoted for a message: its repr (lone surrogates and control characters escaped), the value
    cut to ECHO_CHARS characters with its length named."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= ECHO_CHARS:
        return repr(text)
    return f"{text[:ECHO_CHARS]!r}... ({len(text)} characters)"


def listed(names: Iterable[str]) -> str:
    """Names for a message, comma-separated: the first LISTED, then how many more."""
    names = list(names)
    shown = ", ".join(names[:LISTED])
    return shown if len(names) <= LISTED else f"{shown} and {len(names) - LISTED} more"


def clip(message: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """message as valid UTF-8 of at most `limit` bytes: cut, saying by how much, where longer."""
    data = message.encode("utf-8", "backslashreplace")
    if len(data) <= limit:
        return data.decode()
    return data[: limit - 32].decode("utf-8", "ignore") + f"... (cut from {len(data)} bytes)"


class ServiceError(Exception):
    """Base class. `code` names a grpc.StatusCode member."""

    code = "INTERNAL"

    def __str__(self) -> str:
        return clip(super().__str__())


class InvalidArgument(ServiceError):
    code = "INVALID_ARGUMENT"

    def __init__(self, field: str, problem: str):
        field = field if len(field) <= MAX_FIELD_CHARS else echo(field)
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem

    def within(self, parent: str) -> InvalidArgument:
        """The same problem, its field named from an enclosing message (e.g. "config.sampling.top_p")."""
        return InvalidArgument(f"{parent}.{self.field}", self.problem)


class NotFound(ServiceError):
    """What a request names does not exist here (a model the HTTP door does not serve)."""

    code = "NOT_FOUND"

    def __init__(self, field: str, problem: str):
        field = field if len(field) <= MAX_FIELD_CHARS else echo(field)
        super().__init__(f"{field}: {problem}")
        self.field = field


class AlreadyExists(ServiceError):
    """What a request would make exists already (a voice of that name)."""

    code = "ALREADY_EXISTS"


class FailedPrecondition(ServiceError):
    """The service cannot do this in the state it is in (a vocoder that speaks in no voice asked to add one)."""

    code = "FAILED_PRECONDITION"


class PermissionDenied(ServiceError):
    """The caller may not do this here (a page of another site changing the gateway's voices)."""

    code = "PERMISSION_DENIED"


class Unavailable(ServiceError):
    """A stage (llm, vocoder) cannot be reached or failed in transit."""

    code = "UNAVAILABLE"

    def __init__(self, stage: str, detail: str):
        super().__init__(f"{stage} unavailable: {detail}")
        self.stage = stage


class StageError(ServiceError):
    """A stage answered with an error status: passed on with the stage named."""

    def __init__(self, stage: str, code: str, detail: str):
        super().__init__(f"{stage}: {detail}")
        self.stage = stage
        self.code = code


class Unauthenticated(ServiceError):
    """A call to the API without one of the configured keys (auth.py)."""

    code = "UNAUTHENTICATED"


class DeadlineExceeded(ServiceError):
    code = "DEADLINE_EXCEEDED"


class ResourceExhausted(ServiceError):
    code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, retry_after: float | None = None):
        """retry_after: seconds after which a retry may succeed; sent to the client (interceptor.py)."""
        super().__init__(message)
        self.retry_after = retry_after


class Cancelled(ServiceError):
    code = "CANCELLED"


class Internal(ServiceError):
    code = "INTERNAL"


class DeviceLost(ServiceError):
    """The service's GPU no longer runs its work (a sticky CUDA error): it stops serving and exits, to be
    started again on a fresh context (services/common/device.py). Callers may retry elsewhere, or soon."""

    code = "UNAVAILABLE"
    EXIT_CODE = 3  # the process's, so that its supervisor can tell
