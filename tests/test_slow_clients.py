"""Slow and silent clients cannot hold capacity: a call whose client stops reading ends CANCELLED after
--client-stall-seconds, freeing its place and its stages; one client (an API key) has at most
--max-turns-per-client turns running or waiting, and is refused RESOURCE_EXHAUSTED with a retry hint beyond them,
while other clients still get places."""

import asyncio
import time
from types import SimpleNamespace

import grpc
import pytest
from conftest import left_held, metric_value, own_gateway, scrape
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from services.common.errors import ResourceExhausted
from services.gateway.admission import RETRY_MAX, RETRY_MIN, Admission, client_of
from services.stack import Ports, Stack

KEYS = ("alpha", "beta")
# A reply of 400 tokens is 32 s of PCM16 at 24 kHz (~1.5 MB): far over the 64 kB that HTTP/2 lets a stream hold
# unread when the client's window never grows (BDP probing off), so a client that never reads blocks the gateway's
# writes within the first chunks, while the llm is still making the reply.
LONG = common_pb2.SamplingParams(max_new_tokens=400, min_new_tokens=400)
SHORT = common_pb2.SamplingParams(max_new_tokens=8)  # the other clients' turns: quick
# A turn is held at the first llm chunk after its client has left a message for CLIENT_HOLD_SECONDS (0.5 s); paced,
# the llm sends a chunk (up to 20 tokens: 1.6 s of audio) every 1.6 s or so, so the call must outlast that to be held
# before it is ended.
STALL_SECONDS = 2.5


def bearer(key):
    return (("authorization", f"Bearer {key}"),)


@pytest.fixture(scope="module")
def paced(tmp_path_factory):
    """llm + vocoder with the llm paced as on CUDA (--max-audio-lead: 1.5 s of audio ahead of the listener). Unpaced,
    as on CPU by default, the llm may make a whole 400-token reply before a silent client's window fills, leaving
    the turn nothing to hold (CI saw it); paced, it is still making the reply when its client stops reading, which
    is the case the hold is for."""
    with Stack(Ports.free(), log_dir=tmp_path_factory.mktemp("paced-logs"), without=("encoder",),
               extra_args={"llm": ["--max-audio-lead", "1.5"]}) as s:
        yield s


@pytest.fixture(scope="module")
def gateway(paced, tmp_path_factory):
    """A gateway of its own in front of the shared stack: three places, no queue, two per client, and a second
    without a message taken ends a call."""
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("\n".join(KEYS) + "\n")
    with own_gateway(paced, tmp_path_factory.mktemp("logs"), "--api-keys-file", str(keys), "--max-turns", "3",
                     "--max-queued-turns", "0", "--max-turns-per-client", "2",
                     "--client-stall-seconds", str(STALL_SECONDS)) as gw:
        yield gw


def wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return value


def gateway_metric(gateway, name, labels=""):
    return metric_value(scrape(gateway.metrics), name, labels)


async def synthesize(stub, key, sampling=SHORT):
    request = gateway_pb2.SynthesizeRequest(text="hi", sampling=sampling)
    return [m async for m in stub.Synthesize(request, timeout=60, metadata=bearer(key))]


def test_silent_clients_are_ended_and_free_their_places(gateway, paced):
    async def scenario():
        target = gateway.target
        stalled_before = gateway_metric(gateway, "gateway_stalled_calls_total", '{method="Synthesize"}')
        holds_before = gateway_metric(gateway, "gateway_client_holds_total")
        # A client that never reads: its window stays at 64 kB
        silent = grpc.aio.insecure_channel(target, options=[("grpc.http2.bdp_probe", 0)])
        calls = [gateway_pb2_grpc.GatewayStub(silent).Synthesize(
            gateway_pb2.SynthesizeRequest(text=f"never read {i}", sampling=LONG), timeout=60, metadata=bearer("alpha"))
            for i in range(2)]
        async with grpc.aio.insecure_channel(target) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            await asyncio.to_thread(wait_for, lambda: gateway_metric(gateway, "gateway_active_requests") == 2, 30,
                                    "the silent client's turns never started")
            # alpha is at its own limit: refused at once, with a hint, while beta still gets the third place
            t0 = time.perf_counter()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await synthesize(stub, "alpha")
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "this client has 2 turns running or waiting (--max-turns-per-client 2)" in refused.value.details()
            assert time.perf_counter() - t0 < 1.0
            retry_ms = dict(refused.value.trailing_metadata())["retry-after-ms"]
            assert RETRY_MIN * 1000 <= int(retry_ms) <= RETRY_MAX * 1000
            assert (await synthesize(stub, "beta"))[-1].summary.audio_tokens > 0
            # The silent calls end within the stall bound (plus the time to fill their windows), everything they held
            # is given back, and alpha may call again
            await asyncio.to_thread(
                wait_for, lambda: gateway_metric(gateway, "gateway_stalled_calls_total", '{method="Synthesize"}')
                >= stalled_before + 2, 30, "the silent calls were not ended")
            await asyncio.to_thread(wait_for, lambda: not any(left_held(gateway, paced).values()), 10, "a stage still holds them")
            # meanwhile their turns had stopped feeding the vocoder
            assert gateway_metric(gateway, "gateway_client_holds_total") > holds_before
            assert (await synthesize(stub, "alpha"))[-1].summary.audio_tokens > 0
        # When the silent client reads at last: what had been sent, then CANCELLED saying why
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                async for _ in call:
                    pass
            assert ended.value.code() == grpc.StatusCode.CANCELLED
            assert f"the client took no message for {STALL_SECONDS:g} s (it stopped reading)" in ended.value.details()
        await silent.close()

    asyncio.run(scenario())
    assert gateway_metric(gateway, "gateway_client_admissions_refused_total") >= 1


def test_a_silent_converse_client_is_ended_too(gateway, paced):
    async def scenario():
        silent = grpc.aio.insecure_channel(gateway.target, options=[("grpc.http2.bdp_probe", 0)])
        call = gateway_pb2_grpc.GatewayStub(silent).Converse(timeout=60, metadata=bearer("beta"))
        await call.write(gateway_pb2.ConverseRequest(config=gateway_pb2.SessionConfig(sampling=LONG)))
        await call.write(gateway_pb2.ConverseRequest(turn=gateway_pb2.UserTurn(text="a long reply, never read")))
        stalled = '{method="Converse"}'
        before = gateway_metric(gateway, "gateway_stalled_calls_total", stalled)
        holds_before = gateway_metric(gateway, "gateway_client_holds_total")
        await asyncio.to_thread(wait_for, lambda: gateway_metric(gateway, "gateway_stalled_calls_total", stalled) > before,
                                30, "the silent session was not ended")
        # before it ended, its turn had stopped feeding the vocoder and had the llm hold it
        assert gateway_metric(gateway, "gateway_client_holds_total") > holds_before
        await asyncio.to_thread(wait_for, lambda: not any(left_held(gateway, paced).values()), 10, "a stage still holds it")
        call.cancel()
        await silent.close()

    asyncio.run(scenario())


def test_a_turn_feeds_the_vocoder_only_while_its_client_takes_its_audio():
    """Turn._client_reading: no wait while the client takes each message; once it has held one for
    CLIENT_HOLD_SECONDS, the llm holds the turn and the pump waits until the client takes it."""
    from services.gateway.client_writes import ClientWrites
    from services.gateway.pipeline import CLIENT_HOLD_SECONDS, Turn

    async def scenario():
        holds = []

        async def hold_llm(replica, held):  # Llm.Hold, as the turn asks it of its replica
            holds.append((replica, held))

        client = ClientWrites()
        turn = SimpleNamespace(client=client, llm=SimpleNamespace(replica="llm-1"), _hold_llm=hold_llm, place=None)
        await asyncio.wait_for(Turn._client_reading(turn), 0.1)  # nothing waits for the client
        writing = client.writing()
        writing.__enter__()
        await asyncio.wait_for(Turn._client_reading(turn), 0.1)  # a message just handed over: not held yet
        client.writing_since = time.perf_counter() - CLIENT_HOLD_SECONDS - 0.01
        held_pump = asyncio.create_task(Turn._client_reading(turn))
        await asyncio.sleep(0.1)
        assert not held_pump.done()  # the client has not taken it for too long: the vocoder gets nothing more...
        assert holds == [("llm-1", True)]  # ... nor the llm steps
        writing.__exit__(None, None, None)  # it takes the message
        await asyncio.wait_for(held_pump, 1.0)
        assert holds == [("llm-1", True), ("llm-1", False)]  # released before the pump goes on

    asyncio.run(scenario())


def test_a_client_over_its_own_limit_is_refused_and_holds_nothing():
    async def scenario():
        adm = Admission(max_turns=8, max_queued=0, max_per_client=1)
        hold = asyncio.Event()

        async def turn(client):
            async with adm.turn(None, client):
                await hold.wait()

        first = asyncio.create_task(turn("key:a"))
        await asyncio.sleep(0)
        with pytest.raises(ResourceExhausted, match="this client has 1 turns running or waiting") as info:
            await turn("key:a")
        assert RETRY_MIN <= info.value.retry_after <= RETRY_MAX
        other = asyncio.create_task(turn("key:b"))  # another client still gets a place
        await asyncio.sleep(0)
        assert adm.running == 2 and adm.by_client == {"key:a": 1, "key:b": 1}
        hold.set()
        await asyncio.gather(first, other)
        assert adm.running == 0 and not adm.by_client  # nothing kept for clients that left
        async with adm.turn(None, "key:a"):  # and a's next turn goes through
            pass

    asyncio.run(scenario())


@pytest.mark.parametrize("metadata, peer, client", [
    ((("authorization", "Bearer s3cret"),), "ipv4:127.0.0.1:5555", "key:"),
    ((("authorization", "bearer  s3cret"),), "ipv4:127.0.0.1:5555", "key:"),  # as auth takes it: any case, spaces
    ((("authorization", "Bearer s3cret"),), "unix:/tmp/sock", "key:"),
    ((), "ipv4:10.0.0.7:51234", "ipv4:10.0.0.7"),
    ((), "ipv6:[2001:db8::7]:40000", "ipv6:[2001:db8::7]"),
    # this host's own, without a key (a local proxy, the bench): no one client, not counted
    ((), "ipv4:127.0.0.1:5555", None),
    ((), "ipv4:127.3.2.1:5555", None),
    ((), "ipv6:[::1]:40000", None),
    ((), "ipv6:[::ffff:127.0.0.1]:40000", None),
    ((("user-agent", "x"),), "unix:/tmp/sock", None),
])
def test_who_a_client_is(metadata, peer, client):
    context = SimpleNamespace(invocation_metadata=lambda: metadata, peer=lambda: peer)
    got = client_of(context)
    if client is None:
        assert got is None
        return
    assert got.startswith(client) and "s3cret" not in got
    other = SimpleNamespace(invocation_metadata=lambda: (("authorization", "Bearer other"),), peer=lambda: peer)
    assert client_of(other) != client_of(SimpleNamespace(invocation_metadata=lambda: (("authorization", "Bearer s3cret"),),
                                                         peer=lambda: peer))
