"""Typed errors raised anywhere in the services; services/common/interceptor.py maps them to gRPC
status codes in one place. Nothing here imports grpc, so engines can raise them freely."""

from __future__ import annotations


class ServiceError(Exception):
    """Base class. `code` names a grpc.StatusCode member."""

    code = "INTERNAL"


class InvalidArgument(ServiceError):
    code = "INVALID_ARGUMENT"

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem

    def within(self, parent: str) -> InvalidArgument:
        """The same problem, its field named from an enclosing message (e.g. "config.sampling.top_p")."""
        return InvalidArgument(f"{parent}.{self.field}", self.problem)


class NotFound(ServiceError):
    """What a request names does not exist here (a model the HTTP door does not serve)."""

    code = "NOT_FOUND"

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field


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
