"""One gateway in front of two llm and two vocoder replicas (real processes): calls and sessions are spread over
them, a session stays on its llm replica, a replica that dies is skipped (a call it had not answered yet starts
again on another), a session whose replica died or restarted goes on from the history the gateway kept and says
what it would have said, and a replica that comes back gets work again."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from types import SimpleNamespace

import grpc
import pytest
from conftest import metric_value, own_gateway, replica_ready, scrape
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, llm_pb2, llm_pb2_grpc

from services.gateway.client import converse
from services.stack import NO_SPEECH, Ports, Stack

REPLICAS = {"llm": 2, "vocoder": 2}
GREEDY = common_pb2.SamplingParams(temperature=0.0, max_new_tokens=12, min_new_tokens=12)
SHORT = common_pb2.SamplingParams(max_new_tokens=6, seed=1)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with Stack(Ports.free(REPLICAS), without=NO_SPEECH, log_dir=tmp_path_factory.mktemp("logs"), replicas=REPLICAS) as s:
        # The gateway serves once a replica of each stage is ready: wait until it has seen them all.
        wait_for(lambda: all(replica_ready(s, r) for r in s.replicas("llm") + s.replicas("vocoder")), 10, "replicas")
        yield s


def metric(stack, name: str, instance: str, labels: str = "") -> float:
    return metric_value(scrape(stack.ports.metrics[instance]), name, labels)


def per_replica(stack, service: str, name: str, labels: str = "") -> dict[str, float]:
    return {r: metric(stack, name, r, labels) for r in stack.replicas(service)}


def placed(stack) -> dict[str, float]:
    """Sessions the gateway has placed on each llm replica."""
    return {r: metric(stack, "gateway_replica_sessions", "gateway", f'{{target="{stack.target(r)}"}}')
            for r in stack.replicas("llm")}


def wait_for(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def wait_idle(stack) -> None:
    wait_for(lambda: metric(stack, "gateway_active_sessions", "gateway") == 0
             and all(v == 0 for v in per_replica(stack, "llm", "llm_sessions").values()), 10, "sessions left open")


async def synthesize_many(target: str, n: int) -> list[list]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def one(i: int):
            request = gateway_pb2.SynthesizeRequest(text=f"hello number {i}", sampling=SHORT)
            return [m async for m in stub.Synthesize(request, timeout=60)]

        return await asyncio.gather(*(one(i) for i in range(n)))


def restart(stack, name: str) -> None:
    stack.procs.pop(name).wait()
    stack.start(name)
    stack.wait_serving([name])
    wait_for(lambda: replica_ready(stack, name), 10, f"the gateway never saw {name} back")


def test_calls_are_spread_over_the_replicas(stack):
    ok = '{code="OK"}'
    before = {s: per_replica(stack, s, f"{s}_requests_total", ok) for s in ("llm", "vocoder")}
    replies = asyncio.run(synthesize_many(stack.target("gateway"), 8))
    assert all(r[-1].summary.audio_tokens == 6 for r in replies)
    for service in ("llm", "vocoder"):
        after = per_replica(stack, service, f"{service}_requests_total", ok)
        took = [after[r] - before[service][r] for r in stack.replicas(service)]
        assert sum(took) == 8 and min(took) >= 3, (service, took)  # least loaded first, equals in turn


def test_sessions_are_spread_and_stay_on_their_replica(stack):
    wait_idle(stack)
    moves = metric(stack, "gateway_session_moves_total", "gateway")

    async def scenario():
        async with converse(stack.target("gateway"), sampling=SHORT) as a, \
                converse(stack.target("gateway"), sampling=SHORT) as b, \
                converse(stack.target("gateway"), sampling=SHORT) as c, \
                converse(stack.target("gateway"), sampling=SHORT) as d:
            sessions = (a, b, c, d)
            await asyncio.gather(*(s.say("Hello!") for s in sessions))
            first = placed(stack), per_replica(stack, "llm", "llm_sessions")
            seconds = await asyncio.gather(*(s.say("Tell me more.") for s in sessions))
            return first, (placed(stack), per_replica(stack, "llm", "llm_sessions")), seconds

    first, second, replies = asyncio.run(scenario())
    assert list(first[0].values()) == [2, 2] and list(first[1].values()) == [2, 2], first
    assert second == first, second  # every second turn went where its session was: no replica holds a third
    assert metric(stack, "gateway_session_moves_total", "gateway") == moves
    assert all(r.summary.audio_tokens == 6 and r.summary.prompt_tokens > 40 for r in replies)
    wait_idle(stack)
    assert list(placed(stack).values()) == [0, 0]


async def two_turns(target: str, between=None) -> tuple[gateway_pb2.SynthesisSummary, bytes]:
    """A greedy session of two turns (`between` runs after the first) → the second turn's summary and PCM."""
    async with converse(target, sampling=GREEDY) as conv:
        await conv.say("Hello, who are you?")
        if between is not None:
            await between()
        second = await conv.say("Tell me more.")
    assert second.summary is not None, second
    return second.summary, b"".join(second.chunks)


def only_session(stack) -> str:
    """The llm replica that holds the one session open."""
    holding = [r for r, n in placed(stack).items() if n == 1]
    assert len(holding) == 1 and sum(placed(stack).values()) == 1, placed(stack)
    return holding[0]


async def llm_turns(targets: list[str], texts: list[str]) -> list[tuple[list[int], list[int]]]:
    """A session's greedy turns sent straight to llm replicas, turn i to targets[i % len(targets)], each with the
    history the turns before reported → each turn's (audio codes, turn_tokens.text); pins released at the end."""
    history, out, used = llm_pb2.PromptTokens(), [], set()
    for i, text in enumerate(texts):
        target = targets[i % len(targets)]
        used.add(target)
        async with grpc.aio.insecure_channel(target) as channel:
            stub = llm_pb2_grpc.LlmStub(channel)
            chunks = [m async for m in stub.Generate(llm_pb2.GenerateRequest(
                text=text, session_id="across", sampling=GREEDY, history=history if history.text else None), timeout=60)]
        final = chunks[-1].turn_tokens
        history.text.extend(final.text)
        history.audio.extend(final.audio)
        out.append(([t for c in chunks for t in c.audio_tokens], list(final.text)))
    for target in used:
        async with grpc.aio.insecure_channel(target) as channel:
            await llm_pb2_grpc.LlmStub(channel).ReleaseSession(llm_pb2.ReleaseSessionRequest(session_id="across"))
    return out


def test_a_session_alternating_between_llm_replicas_says_what_it_says_on_one(stack):
    """No llm keeps a session: turns sent to one replica, then the other, and back, each with the history, are the
    turns of the same session on one replica, token for token; each replica keeps only what it pinned for the
    session's next turn, and nothing once released."""
    wait_idle(stack)
    texts = ["Hello, who are you?", "Tell me more.", "And then?"]
    one, two = (stack.target(r) for r in stack.replicas("llm"))
    on_one = asyncio.run(llm_turns([one], texts))
    alternating = asyncio.run(llm_turns([one, two], texts))
    assert alternating == on_one and all(codes for codes, _ in on_one)
    wait_for(lambda: all(v == 0 for v in per_replica(stack, "llm", "llm_sessions").values())
             and all(v == 0 for v in per_replica(stack, "llm", "llm_kv_blocks_used").values()), 10, "pins left")


@pytest.mark.parametrize("back_by_the_next_turn", [False, True])
def test_a_session_whose_replica_dies_goes_on_as_it_would_have(stack, back_by_the_next_turn):
    """Its replica killed between two turns: the next turn goes to the other replica (or to its own, restarted
    meanwhile), is given the session's history there, and says what the session would have said."""
    wait_idle(stack)
    expected = asyncio.run(two_turns(stack.target("gateway")))
    moves = metric(stack, "gateway_session_moves_total", "gateway")
    holder = []

    async def kill_its_replica():
        holder.append(only_session(stack))
        os.kill(stack.procs[holder[0]].pid, signal.SIGKILL)
        if back_by_the_next_turn:
            restart(stack, holder[0])  # on this thread, blocking the loop: a process started from a worker
            # thread would be signalled to end with that thread (services/common/lifetime.py)
        # Not back: the next turn is sent at once; it may find the replica still marked ready (its call fails
        # unanswered and starts again on the other) or already skipped.

    summary, pcm = asyncio.run(two_turns(stack.target("gateway"), kill_its_replica))
    assert metric(stack, "gateway_session_moves_total", "gateway") == moves + (not back_by_the_next_turn)
    assert summary.prompt_tokens == expected[0].prompt_tokens  # the whole history, given to the replica
    assert pcm == expected[1]
    if back_by_the_next_turn:
        wait_idle(stack)
        return
    assert not replica_ready(stack, holder[0])
    restart(stack, holder[0])  # back: it gets new sessions again (it holds the fewest)
    wait_idle(stack)

    async def note():
        holder.append(only_session(stack))

    asyncio.run(two_turns(stack.target("gateway"), note))
    assert holder[1] == holder[0]
    wait_idle(stack)


def test_a_dead_vocoder_replica_is_skipped(stack):
    victim = stack.replicas("vocoder")[0]
    os.kill(stack.procs[victim].pid, signal.SIGKILL)
    replies = asyncio.run(synthesize_many(stack.target("gateway"), 6))  # sent at once, before a health check
    assert all(r[-1].summary.audio_tokens == 6 for r in replies)
    assert not replica_ready(stack, victim)

    restart(stack, victim)
    survivor = stack.replicas("vocoder")[1]
    before = {r: metric(stack, "vocoder_requests_total", r, '{code="OK"}') for r in (victim, survivor)}
    asyncio.run(synthesize_many(stack.target("gateway"), 4))
    assert metric(stack, "vocoder_requests_total", victim, '{code="OK"}') > 0 == before[victim]  # back in use


@pytest.mark.parametrize("service", ["llm", "vocoder"])
def test_a_call_its_replica_never_answered_starts_again_on_another(stack, tmp_path, service):
    """Health checks far apart, so that only a call can find the replica gone: the calls placed on it before the
    first of them failed are started again on the other replica, and every turn succeeds. (A gateway of its own,
    with --health-check-seconds 60, in front of the module's replicas.)"""
    targets = [f"--{s}-target" for s in ("llm", "vocoder")]
    replicas = [",".join(map(stack.target, stack.replicas(s))) for s in ("llm", "vocoder")]
    with own_gateway(stack, tmp_path, "--health-check-seconds", "60", targets[0], replicas[0], targets[1], replicas[1]) as gw:
        view = SimpleNamespace(target=stack.target, ports=SimpleNamespace(metrics={**stack.ports.metrics, "gateway": gw.metrics}))
        wait_for(lambda: all(replica_ready(view, r) for r in stack.replicas(service)), 10, "replicas")
        victim = stack.replicas(service)[1]
        os.kill(stack.procs[victim].pid, signal.SIGKILL)
        stack.procs[victim].wait()
        replies = asyncio.run(synthesize_many(gw.target, 6))
        assert all(r[-1].summary.audio_tokens == 6 for r in replies)
        retries = metric(view, "gateway_replica_retries_total", "gateway", f'{{backend="{service}"}}')
        assert 1 <= retries <= 3, retries  # (6 calls in turn over two replicas: up to 3 were placed on it)
        assert not replica_ready(view, victim)
    restart(stack, victim)  # for the module's gateway, which saw it go too
