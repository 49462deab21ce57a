"""The error interceptor on its own (services/common/interceptor.py): each kind of ending as the status a client
gets, its retry hint, the code counted, and each method's handler wrapped once. The stacks' tests see the same
through real servers; here a servicer context stands in for gRPC's, so that each case is exact."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from services.common.errors import InvalidArgument, ResourceExhausted
from services.common.interceptor import ErrorInterceptor

METHOD = "/moss.speech.v1.Gateway/Synthesize"


class Context:
    """What the interceptor uses of grpc.aio.ServicerContext."""

    def __init__(self):
        self.status, self.details_text, self.trailing, self.written = None, "", (), []

    def set_code(self, code):
        self.status = code

    def code(self):
        return self.status

    def set_details(self, details):
        self.details_text = details

    def set_trailing_metadata(self, metadata):
        self.trailing = metadata

    async def write(self, message):
        self.written.append(message)

    async def abort(self, code, details="", trailing_metadata=()):
        self.status, self.details_text, self.trailing = code, details, trailing_metadata
        raise grpc.aio.AbortError()


class Details:
    def __init__(self, method=METHOD):
        self.method, self.invocation_metadata = method, ()


def call(interceptor: ErrorInterceptor, behavior, kind: str = "unary_stream") -> tuple[Context, list, BaseException | None]:
    """Run one call of `behavior` through the interceptor → (its context, its responses, what it raised)."""
    factory = {"unary_stream": grpc.unary_stream_rpc_method_handler,
               "unary_unary": grpc.unary_unary_rpc_method_handler}[kind]

    async def run():
        async def continuation(details):
            return factory(behavior)

        handler = await interceptor.intercept_service(continuation, Details())
        context, responses, raised = Context(), [], None
        try:
            if kind == "unary_unary":
                responses.append(await handler.unary_unary("request", context))
            else:
                result = handler.unary_stream("request", context)
                if hasattr(result, "__aiter__"):
                    async for response in result:
                        responses.append(response)
                else:
                    await result
        except BaseException as exc:  # noqa: BLE001 (what the call raised is the result here)
            raised = exc
        return context, responses + context.written, raised

    return asyncio.run(run())


def recorder():
    done: list[tuple[str, str]] = []
    return done, lambda method, code: done.append((method, code))


@pytest.mark.parametrize("write_timeout", [None, 5.0])
def test_a_refusal_carries_its_code_message_and_retry_hint(write_timeout):
    done, on_done = recorder()

    async def refused(request, context):
        yield "first"
        raise ResourceExhausted("gateway busy: 4 turns running", retry_after=1.25)

    context, responses, raised = call(ErrorInterceptor(on_done, write_timeout), refused)
    assert raised is None  # the call ends with its status set; nothing raised up into gRPC
    assert responses == ["first"]
    assert context.status == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert context.details_text == "gateway busy: 4 turns running"
    metadata = dict(context.trailing)
    assert metadata["retry-after-ms"] == "1250"
    status = status_pb2.Status.FromString(metadata["grpc-status-details-bin"])
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] and status.message == context.details_text
    info = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(info) and info.retry_delay.ToMilliseconds() == 1250
    assert done == [("Synthesize", "RESOURCE_EXHAUSTED")]


def test_an_error_without_a_hint_has_no_trailing_metadata():
    done, on_done = recorder()

    async def bad(request, context):
        raise InvalidArgument("text", "is empty")
        yield  # (a streaming method)

    context, _, raised = call(ErrorInterceptor(on_done, 5.0), bad)
    assert raised is None and context.status == grpc.StatusCode.INVALID_ARGUMENT and context.trailing == ()
    assert done == [("Synthesize", "INVALID_ARGUMENT")]


def test_an_unexpected_exception_is_internal_and_named():
    done, on_done = recorder()

    async def broken(request, context):
        raise ValueError("a bug")
        yield

    context, _, raised = call(ErrorInterceptor(on_done), broken)
    assert raised is None and context.status == grpc.StatusCode.INTERNAL
    assert context.details_text == "internal error: ValueError: a bug"
    assert done == [("Synthesize", "INTERNAL")]


def test_a_methods_own_abort_keeps_its_status_and_is_counted():
    done, on_done = recorder()

    async def aborts(request, context):
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no")
        yield

    context, _, raised = call(ErrorInterceptor(on_done, 5.0), aborts)
    assert isinstance(raised, grpc.aio.AbortError)  # gRPC's own ending, passed on
    assert context.status == grpc.StatusCode.PERMISSION_DENIED and done == [("Synthesize", "PERMISSION_DENIED")]


def test_a_unary_method_error_and_answer():
    done, on_done = recorder()

    async def answer(request, context):
        return "answer"

    async def bad(request, context):
        raise InvalidArgument("session_id", "is not known")

    interceptor = ErrorInterceptor(on_done)
    context, responses, raised = call(interceptor, answer, "unary_unary")
    assert raised is None and responses == ["answer"] and context.status is None
    context, responses, raised = call(interceptor, bad, "unary_unary")
    assert raised is None and responses == [None] and context.status == grpc.StatusCode.INVALID_ARGUMENT
    assert done == [("Synthesize", "OK"), ("Synthesize", "INVALID_ARGUMENT")]


def test_each_methods_handler_is_wrapped_once_and_a_per_call_handler_is_not_mixed_up():
    interceptor = ErrorInterceptor()

    async def method(request, context):
        yield "from the method"

    async def refusal(request, context):  # what an interceptor after this one may hand a single call
        yield "from the refusal"

    registered = grpc.unary_stream_rpc_method_handler(method)

    async def run():
        async def same(details):
            return registered

        async def per_call(details):
            return grpc.unary_stream_rpc_method_handler(refusal)

        first = await interceptor.intercept_service(same, Details())
        second = await interceptor.intercept_service(same, Details())
        other = await interceptor.intercept_service(per_call, Details())
        third = await interceptor.intercept_service(same, Details())
        assert first is second  # one wrapping for every call
        assert other is not first and third is not other
        out = []
        for handler in (other, third):
            async for response in handler.unary_stream("request", Context()):
                out.append(response)
        return out

    assert asyncio.run(run()) == ["from the refusal", "from the method"]
