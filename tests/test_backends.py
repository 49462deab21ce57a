"""Placement over replicas (services/gateway/backends.py), in-process: the least-loaded ready replica, equal ones
in turn, a session's own while it is ready, none that is down; and the wait for a stage with no ready replica."""

import asyncio
import functools
import time

import pytest
from moss.speech.v1 import llm_pb2_grpc, vocoder_pb2

from services.common.errors import Unavailable
from services.gateway.backends import Backends, Pool

TARGETS = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]


def in_loop(test):
    """Run the body in an event loop (aio channels and events belong to one)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))
    return run


def pool_of(n: int, ready=True) -> Pool:
    pool = Pool("llm", TARGETS[:n], llm_pb2_grpc.LlmStub)
    for replica in pool.replicas:
        pool.set_ready(replica, ready)
    return pool


@in_loop
async def test_equal_replicas_take_calls_in_turn():
    pool = pool_of(3)
    assert [pool.pick().target for _ in range(6)] == TARGETS * 2


@in_loop
async def test_the_least_loaded_ready_replica_comes_first():
    pool = pool_of(3)
    a, b, c = pool.replicas
    a.add_calls(2)
    b.add_calls(1)
    c.add_calls(1)
    c.add_sessions(3)
    assert pool.pick() is b  # fewest calls, then fewest sessions
    b.add_calls(5)
    assert pool.pick() is c
    pool.mark_down(c)
    assert pool.pick() is a  # c is down: skipped whatever its load
    pool.set_ready(c, True)
    assert pool.pick() is c


@in_loop
async def test_a_sessions_replica_is_kept_while_it_is_ready():
    pool = pool_of(2)
    a, b = pool.replicas
    a.add_calls(10)
    assert pool.pick(prefer=a) is a  # its KV cache is there: load does not move it
    pool.mark_down(a)
    assert pool.pick(prefer=a) is b


@in_loop
async def test_no_ready_replica_is_none_and_the_stage_is_not_ready():
    pool = pool_of(2, ready=False)
    assert pool.pick() is None and not pool.ready
    pool.set_ready(pool.replicas[1], True)
    assert pool.ready and pool.pick() is pool.replicas[1]


def test_a_pool_needs_distinct_targets():
    with pytest.raises(ValueError, match="no llm target"):
        Pool("llm", [], llm_pb2_grpc.LlmStub)
    with pytest.raises(ValueError, match="repeat"):
        Pool("llm", ["h:1", "h:1"], llm_pb2_grpc.LlmStub)


@in_loop
async def test_acquire_waits_for_a_stage_to_be_ready():
    backends = Backends(TARGETS[:2], TARGETS[2:], ready_wait=5.0)
    backends.vocoder.set_ready(backends.vocoder.replicas[0], True)

    async def later():
        await asyncio.sleep(0.2)
        backends.llm.set_ready(backends.llm.replicas[1], True)

    helper = asyncio.create_task(later())
    llm, vocoder, waited = await backends.acquire(budget=5.0)
    await helper
    assert llm is backends.llm.replicas[1] and vocoder is backends.vocoder.replicas[0]
    assert 0.15 < waited < 2.0


@pytest.mark.parametrize("ready_wait, budget", [(0.3, 10.0), (10.0, 0.3)])
@in_loop
async def test_acquire_gives_up_after_the_ready_wait_or_the_budget(ready_wait, budget):
    backends = Backends(TARGETS[:1], TARGETS[1:2], ready_wait=ready_wait)
    backends.llm.set_ready(backends.llm.replicas[0], True)
    start = time.perf_counter()
    with pytest.raises(Unavailable) as info:
        await backends.acquire(budget)
    assert info.value.stage == "vocoder" and "within 0.3 s" in str(info.value)
    assert 0.25 < time.perf_counter() - start < 2.0


@in_loop
async def test_a_replaced_replica_is_marked_down_and_another_taken():
    backends = Backends(TARGETS[:2], TARGETS[2:], ready_wait=1.0)
    for pool in backends.pools:
        for replica in pool.replicas:
            pool.set_ready(replica, True)
    a, b = backends.llm.replicas
    assert await backends.replace(backends.llm, a, budget=1.0) is b
    assert not a.ready
    with pytest.raises(Unavailable):  # the last one fails too: nothing left within the wait
        await backends.replace(backends.llm, b, budget=0.2)


class Vocoder:
    """A vocoder's ListVoices, counted: what `voices` holds when asked."""

    def __init__(self, *voices: str):
        self.voices, self.asked = list(voices), 0

    async def ListVoices(self, request, timeout=None):
        self.asked += 1
        return vocoder_pb2.ListVoicesResponse(voices=sorted(self.voices))


@in_loop
async def test_a_replica_that_has_not_said_it_has_a_voice_another_has_is_asked_again():
    """A voice made on every replica since this gateway last asked one of them (by another gateway): a turn placed on
    the replica not asked since is not refused for it. A name no replica and no owner has costs no call."""
    backends = Backends(TARGETS[:1], TARGETS[1:3], ready_wait=1.0)
    fresh, stale = backends.vocoder.replicas
    for replica, voices in ((fresh, ("default", "new")), (stale, ("default",))):
        replica.stub = Vocoder(*voices)
        assert await replica.list_voices()
        backends.vocoder.set_ready(replica, True)
    stale.stub.voices.append("new")  # (made there too; this gateway has not asked it since)
    assert await backends.voices_of(stale, "new") == ("default", "new") and stale.stub.asked == 2
    assert await backends.voices_of(stale, "new") == ("default", "new") and stale.stub.asked == 2  # known: no call
    assert await backends.voices_of(fresh, "typo") == ("default", "new") and fresh.stub.asked == 1
    assert await backends.voices_of(stale, "") == ("default", "new") and stale.stub.asked == 2  # ("": default)
