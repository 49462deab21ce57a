"""Admission control: bounded turns and a bounded queue; beyond them RESOURCE_EXHAUSTED with a retry hint,
never a hang; a waiter that gives up (deadline, client gone) takes no place with it."""

import asyncio
import time

import grpc
import numpy as np
import pytest
from conftest import gateway_stack, metric_value, scrape
from google.rpc import error_details_pb2, status_pb2
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from services.common.errors import DeadlineExceeded, ResourceExhausted
from services.gateway.admission import RETRY_MAX, RETRY_MIN, Admission
from services.gateway.client import SynthesisResult, converse
from services.gateway.headroom import Headroom, HeadroomRule


def test_places_queue_and_refusal():
    async def scenario():
        adm = Admission(max_turns=1, max_queued=1)
        release_first, order = asyncio.Event(), []

        async def turn(name, deadline=None):
            async with adm.turn(deadline):
                order.append(name)
                if name == "first":
                    await release_first.wait()

        first = asyncio.create_task(turn("first"))
        await asyncio.sleep(0)
        second = asyncio.create_task(turn("second"))  # queued behind it
        await asyncio.sleep(0)
        with pytest.raises(ResourceExhausted) as info:  # the queue is full: refused at once
            await turn("third")
        assert RETRY_MIN <= info.value.retry_after <= RETRY_MAX and "1 turns running and 1 waiting" in str(info.value)
        assert (adm.running, len(adm.waiting)) == (1, 1)
        release_first.set()
        await asyncio.gather(first, second)
        assert order == ["first", "second"] and (adm.running, len(adm.waiting)) == (0, 0)

    asyncio.run(scenario())


def test_an_admitted_turn_starts_once_the_calls_pause_and_waits_no_longer_than_its_most():
    """With start_quiet, a burst's refusals come before the start of the turns it admits (admission.py)."""

    async def started_after(arrivals: float, quiet: float, most: float) -> float:
        admission = Admission(max_turns=1, max_queued=0, start_quiet=quiet, start_quiet_max=most)
        began = time.perf_counter()
        entered, done = asyncio.get_running_loop().create_future(), asyncio.Event()

        async def admitted():
            async with admission.turn(None):
                entered.set_result(time.perf_counter() - began)
                await done.wait()  # (its place kept: the calls below are refused)

        task = asyncio.create_task(admitted())
        while time.perf_counter() - began < arrivals:  # a call every 2 ms, refused (every place taken)
            await asyncio.sleep(0.002)
            with pytest.raises(ResourceExhausted):
                admission.turn(None)
        await entered
        done.set()
        await task
        return entered.result()

    alone = asyncio.run(started_after(0.0, quiet=0.02, most=1.0))
    assert 0.02 <= alone < 0.5                                           # its own call, then 20 ms of quiet
    burst = asyncio.run(started_after(0.15, quiet=0.02, most=1.0))
    assert 0.15 + 0.02 <= burst < 1.0                                    # after the calls stopped
    capped = asyncio.run(started_after(0.6, quiet=0.02, most=0.1))
    assert 0.1 <= capped < 0.55                                          # the most it waits, calls or not
    assert asyncio.run(started_after(0.0, quiet=0.0, most=1.0)) < 0.02   # none asked: at once


def test_a_turn_that_cannot_be_taken_is_refused_by_the_call_itself_and_counts_nothing():
    """Refusals come from `turn()` before any context manager exists (a burst of them is served one after another),
    for every reason: the client's own limit, no place and no queue slot. Nothing is counted for them, so the
    client's next turn, once a place frees, is taken."""
    async def scenario():
        adm = Admission(max_turns=1, max_queued=0, max_per_client=1)
        release = asyncio.Event()

        async def hold():
            async with adm.turn(None, "client-a"):
                await release.wait()

        held = asyncio.create_task(hold())
        await asyncio.sleep(0)
        for client, why in (("client-a", "this client has 1 turns"), ("client-b", "gateway busy"), (None, "gateway busy")):
            with pytest.raises(ResourceExhausted, match=why):
                adm.turn(None, client)  # (not entered, not awaited: the call refuses)
        assert (adm.running, len(adm.waiting), dict(adm.by_client)) == (1, 0, {"client-a": 1})
        release.set()
        await held
        assert (adm.running, dict(adm.by_client)) == (0, {})
        async with adm.turn(None, "client-b") as place:  # the refused client's next turn is taken
            assert place is not None and adm.by_client["client-b"] == 1
        assert (adm.running, dict(adm.by_client)) == (0, {})

    asyncio.run(scenario())


def test_turns_start_a_few_at_a_time_and_each_frees_its_start_slot_at_first_audio_or_its_end():
    """--max-starting-turns 2: four turns admitted at once; two start, the others wait until one has its first audio
    out, or ends without any; a waiter whose deadline passes leaves no slot taken."""
    async def scenario():
        adm = Admission(max_turns=8, max_queued=8, max_starting=2)
        started, first_audio, end = [], {n: asyncio.Event() for n in "abcd"}, asyncio.Event()

        async def turn(name):
            async with adm.turn(None) as place:
                started.append(name)
                if name == "b":
                    return  # ends (fails) before any audio: its slot frees all the same
                await first_audio[name].wait()
                place.started()
                place.started()  # (twice: still one slot)
                await end.wait()

        tasks = [asyncio.create_task(turn(n)) for n in "abcd"]
        await asyncio.sleep(0.01)
        assert started == ["a", "b", "c"] and adm.running == 3  # b ended at once: c took its slot; d waits, placed
        with pytest.raises(DeadlineExceeded, match="waiting to start"):
            async with adm.turn(0.05):
                pass
        first_audio["a"].set()
        await asyncio.sleep(0.01)
        assert started == ["a", "b", "c", "d"]
        for e in first_audio.values():
            e.set()
        end.set()
        await asyncio.gather(*tasks)
        assert adm.running == 0 and adm.starting._value == 2

    asyncio.run(scenario())


def test_ongoing_sessions_turns_wait_ahead_of_new_ones_and_may_use_the_headroom_reserve():
    async def scenario():
        adm = Admission(max_turns=1, max_queued=8)
        hold, order = asyncio.Event(), []

        async def turn(name, ongoing=False):
            async with adm.turn(None, ongoing=ongoing):
                order.append(name)
                if name == "holder":
                    await hold.wait()

        tasks = [asyncio.create_task(turn("holder"))]
        for name, ongoing in (("new 1", False), ("later turn 1", True), ("new 2", False), ("later turn 2", True)):
            tasks.append(asyncio.create_task(turn(name, ongoing)))
            await asyncio.sleep(0)
        assert len(adm.waiting) == 4 and len(adm.ongoing_waiting) == 2
        hold.set()
        await asyncio.gather(*tasks)
        assert order == ["holder", "later turn 1", "later turn 2", "new 1", "new 2"]
        assert not adm.waiting and not adm.ongoing_waiting and adm.running == 0

        # by headroom: at the limit a new session is refused, an ongoing one's turn still runs (the reserve)
        headroom = Headroom(HeadroomRule(initial_limit=10, min_limit=1, burst_turns=0))
        adm = Admission(max_turns=64, max_queued=0, headroom=headroom)
        adm.running = 10
        with pytest.raises(ResourceExhausted, match="no headroom"):
            async with adm.turn(None):
                pass
        async with adm.turn(None, ongoing=True):
            assert adm.running == 11
        adm.running = 11
        with pytest.raises(ResourceExhausted, match="no headroom"):  # the reserve is 10% of the limit: one turn here
            async with adm.turn(None, ongoing=True):
                pass

    asyncio.run(scenario())


def test_turns_held_for_their_silent_clients_do_not_count_against_the_headroom_limit():
    """A CPU stack's limit of 2: two turns whose clients stopped reading are held, and two more play; let go, the
    two held count again and a fifth is refused. Under count admission a held turn keeps its place."""
    async def scenario():
        adm = Admission(max_turns=64, max_queued=0, headroom=Headroom(HeadroomRule(initial_limit=2, min_limit=2,
                                                                                    burst_turns=0)))
        silent = [await adm.turn(None).__aenter__() for _ in range(2)]
        with pytest.raises(ResourceExhausted, match="no headroom: 2 turns playing"):
            async with adm.turn(None):
                pass
        with silent[0].held(), silent[1].held():
            assert (adm.running, adm.held, adm.playing) == (2, 2, 0)
            readers = [await adm.turn(None).__aenter__() for _ in range(2)]
            assert (adm.running, adm.playing) == (4, 2)
        assert (adm.held, adm.playing) == (0, 4)
        with pytest.raises(ResourceExhausted, match="no headroom: 4 turns playing"):
            async with adm.turn(None):
                pass
        for place in (*silent, *readers):
            place.started()

        counted = Admission(max_turns=1, max_queued=0)
        place = await counted.turn(None).__aenter__()
        with place.held(), pytest.raises(ResourceExhausted, match="gateway busy"):
            async with counted.turn(None):
                pass

    asyncio.run(scenario())


def test_a_waiter_that_gives_up_takes_no_place():
    async def scenario():
        adm = Admission(max_turns=1, max_queued=4)
        hold = asyncio.Event()

        async def holder():
            async with adm.turn(None):
                await hold.wait()

        task = asyncio.create_task(holder())
        await asyncio.sleep(0)
        with pytest.raises(DeadlineExceeded, match="waiting for a place"):  # its deadline passes in the queue
            async with adm.turn(0.05):
                pass
        leaving = asyncio.create_task(adm.turn(None).__aenter__())  # a client that leaves while queued
        await asyncio.sleep(0.01)
        leaving.cancel()
        await asyncio.gather(leaving, return_exceptions=True)
        assert (adm.running, len(adm.waiting)) == (1, 0)
        later = asyncio.create_task(holder())  # the next waiter still gets the place when it frees
        await asyncio.sleep(0)
        hold.set()
        await asyncio.gather(task, later)
        assert (adm.running, len(adm.waiting)) == (0, 0)

    asyncio.run(scenario())


@pytest.fixture(scope="module")
def one_place(stack, tmp_path_factory):
    """A gateway with one place for a turn and no queue."""
    with gateway_stack(stack, tmp_path_factory.mktemp("logs"), "--max-turns", "1", "--max-queued-turns", "0") as s:
        yield s


def test_gateway_refuses_beyond_its_bounds_with_a_retry_hint(one_place):
    stack = one_place
    target = stack.target("gateway")

    async def scenario():
        async with grpc.aio.insecure_channel(target) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            long = stub.Synthesize(gateway_pb2.SynthesizeRequest(
                text="a long reply", sampling=common_pb2.SamplingParams(max_new_tokens=60, min_new_tokens=60, seed=1)),
                timeout=60)
            await long.read()  # its metadata: it holds the one place now
            refused = stub.Synthesize(gateway_pb2.SynthesizeRequest(text="hi"), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await refused.read()
            rest = []
            while (msg := await long.read()) is not grpc.aio.EOF:
                rest.append(msg)
            return info.value, rest, await refused.trailing_metadata()

    err, rest, trailers = asyncio.run(scenario())
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "gateway busy" in err.details()
    assert rest[-1].summary.audio_tokens == 60  # the admitted turn was not disturbed
    meta = dict(trailers)
    status = status_pb2.Status.FromString(meta["grpc-status-details-bin"])
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    info = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(info)
    delay = info.retry_delay.ToTimedelta().total_seconds()
    assert RETRY_MIN <= delay <= RETRY_MAX and int(meta["retry-after-ms"]) == round(delay * 1000)
    text = scrape(stack.ports.metrics["gateway"])
    assert metric_value(text, "gateway_admissions_refused_total") == 1
    assert metric_value(text, "gateway_requests_total", '{code="RESOURCE_EXHAUSTED"}') == 1
    assert metric_value(text, "gateway_queued_turns") == 0


def test_a_refused_converse_turn_keeps_its_session(one_place):
    """In a session, a turn that finds no place gets TurnFailed (RESOURCE_EXHAUSTED, with the retry hint) and the
    session goes on: the same turn sent again once the place is free is spoken, its history intact."""
    stack = one_place
    refused_before = metric_value(scrape(stack.ports.metrics["gateway"]), "gateway_admissions_refused_total")

    async def scenario():
        async with grpc.aio.insecure_channel(stack.target("gateway")) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            long = stub.Synthesize(gateway_pb2.SynthesizeRequest(
                text="a long reply", sampling=common_pb2.SamplingParams(max_new_tokens=60, min_new_tokens=60, seed=1)),
                timeout=60)
            await long.read()  # it holds the one place now
            async with converse(stack.target("gateway"), sampling=common_pb2.SamplingParams(max_new_tokens=6, seed=1)) as conv:
                refused = await conv.say("hello")
                while await long.read() is not grpc.aio.EOF:  # the place frees
                    pass
                await asyncio.sleep(refused.failed.retry_after_seconds)
                spoken = await conv.say("hello")
            return refused, spoken, conv.ended  # (closed on leaving the block)

    refused, spoken, ended = asyncio.run(scenario())
    assert refused.failed.code == "RESOURCE_EXHAUSTED" and "gateway busy" in refused.failed.message
    assert RETRY_MIN <= refused.failed.retry_after_seconds <= RETRY_MAX and refused.summary is None
    assert spoken.failed is None and spoken.summary.audio_tokens == 6
    assert ended.reason == gateway_pb2.SESSION_END_REASON_CLOSED  # closed by the client, not ended by the refusal
    text = scrape(stack.ports.metrics["gateway"])
    assert metric_value(text, "gateway_admissions_refused_total") == refused_before + 1
    assert metric_value(text, "gateway_turn_failures_total", '{code="RESOURCE_EXHAUSTED"}') == 1


def test_the_bench_counts_refusals_as_the_services_answer(one_place, tmp_path):
    """Poisson levels past one place with no queue: refusals come back at once with their hint, the bench counts them
    apart (goodput, the knee plot) and does not call them failures."""
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "services.cli", "bench", "--no-progress", "--target",
                           one_place.target("gateway"), "--rate", "20,40", "--requests", "8", "--max-new-tokens", "12",
                           "--warmup", "0", "--out", str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    levels = json.loads((tmp_path / "bench.json").read_text())["levels"]
    assert list(levels) == ["rate 20/s", "rate 40/s"]
    refused = sum(lv["summary"]["refused"] for lv in levels.values())
    assert refused >= 1 and all(lv["summary"]["refusals_with_hint"] == lv["summary"]["refused"] for lv in levels.values())
    for lv in levels.values():
        s = lv["summary"]
        assert s["ok"] + s["refused"] == s["requests"] == 8
        if s["refused"]:
            assert s["refusal_seconds"]["max"] < 1.0  # at once, not after a wait
        hints = [x["retry_after_s"] for x in lv["streams"] if x["code"] == "RESOURCE_EXHAUSTED"]
        assert all(RETRY_MIN <= h <= RETRY_MAX for h in hints)
    assert "offered/s" in proc.stdout and (tmp_path / "goodput.png").read_bytes()[:4] == b"\x89PNG"



def test_a_turn_of_an_ongoing_session_goes_ahead_of_a_new_call(stack, tmp_path):
    """One place: while a long reply holds it, a new Synthesize call queues, then the next turn of a session answered
    before; when the place frees, the session's turn runs first, and the new call only after it."""
    with gateway_stack(stack, tmp_path, "--max-turns", "1", "--max-queued-turns", "4") as gw:
        target, metrics_port = gw.target("gateway"), gw.ports.metrics["gateway"]

        async def queued(n: int) -> None:
            while metric_value(await asyncio.to_thread(scrape, metrics_port), "gateway_queued_turns") != n:
                await asyncio.sleep(0.02)

        async def first_audio_at(call) -> float:
            async for msg in call:
                if msg.WhichOneof("kind") == "audio":
                    return time.perf_counter()
            raise AssertionError("no audio")

        async def scenario():
            short = common_pb2.SamplingParams(max_new_tokens=6, seed=1)
            async with converse(target, sampling=short) as conv, grpc.aio.insecure_channel(target) as channel:
                assert (await conv.say("hello")).summary is not None  # answered: the session is ongoing
                stub = gateway_pb2_grpc.GatewayStub(channel)
                long = stub.Synthesize(gateway_pb2.SynthesizeRequest(text="a long reply", sampling=common_pb2.SamplingParams(
                    max_new_tokens=150, min_new_tokens=150, seed=1)), timeout=60)
                await long.read()  # it holds the one place now
                new = asyncio.create_task(first_audio_at(stub.Synthesize(
                    gateway_pb2.SynthesizeRequest(text="a new call", sampling=short), timeout=60)))
                await asyncio.wait_for(queued(1), 10)
                later = asyncio.create_task(conv.say("and then?"))
                await asyncio.wait_for(queued(2), 10)
                while await long.read() is not grpc.aio.EOF:  # the place frees
                    pass
                turn = await later
                later_done = time.perf_counter()
                return turn, later_done, await new

        turn, later_done, new_audio = asyncio.run(scenario())
        assert turn.summary is not None and turn.summary.audio_tokens == 6
        assert new_audio > later_done  # the new call started only once the session's turn had its place back


def test_a_queued_turns_wait_counts_in_its_time_to_first_audio(stack, tmp_path):
    """TTFA runs from the turn's arrival at the gateway (shared/DESIGN.md §6), so a turn that waited for a place has
    that wait in its summary's TTFA, llm first chunk and total, in admission_wait_seconds, and in the gateway's TTFA
    histogram: what its caller waited, not only the stages' part."""
    with gateway_stack(stack, tmp_path, "--max-turns", "1", "--max-queued-turns", "2") as s:
        target, metrics_port = s.target("gateway"), s.ports.metrics["gateway"]

        async def read_all(call) -> list:
            out = []
            while (msg := await call.read()) is not grpc.aio.EOF:
                out.append(msg)
            return out

        async def scenario():
            async with grpc.aio.insecure_channel(target) as channel:
                stub = gateway_pb2_grpc.GatewayStub(channel)
                sampling = common_pb2.SamplingParams(max_new_tokens=40, min_new_tokens=40, seed=1)
                first = stub.Synthesize(gateway_pb2.SynthesizeRequest(text="first", sampling=sampling), timeout=60)
                await first.read()  # its metadata: it holds the one place
                sent = time.perf_counter()
                queued = stub.Synthesize(gateway_pb2.SynthesizeRequest(text="second", sampling=sampling), timeout=60)
                first_summary = (await read_all(first))[-1].summary
                waited = time.perf_counter() - sent  # the queued turn had no place until the first one ended
                return first_summary, (await read_all(queued))[-1].summary, waited

        ttfa_sum = metric_value(scrape(metrics_port), "gateway_ttfa_seconds_sum", '{protocol="grpc"}')
        first, second, waited = asyncio.run(scenario())
        assert first.admission_wait_seconds < 0.05
        assert second.admission_wait_seconds > 0.5 * waited > 0.05
        for part in (second.ttfa_seconds, second.llm_first_chunk_seconds, second.total_seconds):
            assert part > second.admission_wait_seconds
        grew = metric_value(scrape(metrics_port), "gateway_ttfa_seconds_sum", '{protocol="grpc"}') - ttfa_sum
        assert grew == pytest.approx(first.ttfa_seconds + second.ttfa_seconds, abs=1e-6)


def test_the_turns_at_once_follow_the_vocoders_stream_slots():
    """cap_turns: fewer slots than --max-turns lower the limit (and a headroom rule's ceiling and burst with it); more
    slots, or none reported, bring --max-turns back, and the turns waiting meanwhile get the places made."""
    from services.gateway.headroom import Headroom, HeadroomRule

    async def scenario():
        adm = Admission(max_turns=4, max_queued=8)
        adm.cap_turns(2)
        assert adm.max_turns == 2
        hold = asyncio.Event()

        async def turn():
            async with adm.turn(None):
                await hold.wait()

        tasks = [asyncio.create_task(turn()) for _ in range(4)]
        await asyncio.sleep(0.01)
        assert adm.running == 2 and len(adm.waiting) == 2
        adm.cap_turns(None)  # (no limit of the vocoders': --max-turns again)
        await asyncio.sleep(0.01)
        assert adm.max_turns == 4 and adm.running == 4 and not adm.waiting
        hold.set()
        await asyncio.gather(*tasks)
        assert adm.running == 0

        room = Headroom(HeadroomRule(initial_limit=48, max_limit=256, burst_turns=128))
        adm = Admission(max_turns=256, max_queued=0, headroom=room)
        adm.cap_turns(32)
        assert (room.rule.max_limit, room.rule.burst_turns, room.limit) == (32, 32, 32)
        adm.cap_turns(300)
        assert (room.rule.max_limit, room.rule.burst_turns, adm.max_turns) == (256, 128, 256)

    asyncio.run(scenario())


def test_a_speaking_user_holds_no_turn_and_a_spoken_turn_refused_at_its_end_keeps_the_session(stack, tmp_path):
    """A speaking user holds an encoder place only: the one place stays with a typed turn while a session speaks, the
    spoken turn is admitted (here: refused, TurnFailed with the retry hint) once its speech has ended, its encoder
    place is given back, and the session's next spoken turn is answered once the place is free."""
    from tests.speech import spoken

    samples, rate = spoken("Is there a place for me?")
    with gateway_stack(stack, tmp_path, "--max-turns", "1", "--max-queued-turns", "0",
                       "--encoder-target", stack.target("encoder")) as one_place:
        check_a_speaking_user(one_place, samples, rate)


def check_a_speaking_user(stack, samples, rate):

    def gateway(name: str) -> float:
        return metric_value(scrape(stack.ports.metrics["gateway"]), name)

    async def scenario():
        async with grpc.aio.insecure_channel(stack.target("gateway")) as channel:
            long = gateway_pb2_grpc.GatewayStub(channel).Synthesize(gateway_pb2.SynthesizeRequest(
                text="a long reply", sampling=common_pb2.SamplingParams(max_new_tokens=60, min_new_tokens=60, seed=1)),
                timeout=60)
            await long.read()  # it holds the one place now
            async with converse(stack.target("gateway"), sampling=common_pb2.SamplingParams(max_new_tokens=6, seed=1),
                                timeout=120) as conv:
                # the speech without its end: the user is still speaking
                pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
                await conv.call.write(gateway_pb2.ConverseRequest(speech=gateway_pb2.SpeechInput(
                    sample_rate=rate, format=common_pb2.AUDIO_FORMAT_PCM16)))
                await conv.call.write(gateway_pb2.ConverseRequest(audio=gateway_pb2.UserAudio(pcm=pcm)))
                deadline = time.monotonic() + 30
                while metric_value(scrape(stack.ports.metrics["encoder"]), "encoder_speakers") != 1:
                    assert time.monotonic() < deadline, "the encoder never took the speaker"
                    await asyncio.sleep(0.05)
                turns_while_speaking = gateway("gateway_active_requests")
                await conv.call.write(gateway_pb2.ConverseRequest(end_of_speech=gateway_pb2.EndOfSpeech()))
                conv.turns_sent += 1
                refused = SynthesisResult()
                async for msg in conv.replies():
                    refused.take(msg, time.perf_counter())
                while await long.read() is not grpc.aio.EOF:  # the place frees
                    pass
                await asyncio.sleep(refused.failed.retry_after_seconds if refused.failed else 0)
                answered = await conv.speak(samples, rate, realtime=False)
            return turns_while_speaking, refused, answered

    turns_while_speaking, refused, answered = asyncio.run(scenario())
    assert turns_while_speaking == 1  # the typed turn's: the speech holds an encoder place, no turn
    assert refused.speech_ended is not None and refused.speech_ended.codes > 0  # heard whole, then refused
    assert refused.failed is not None and refused.failed.code == "RESOURCE_EXHAUSTED", refused.failed
    assert RETRY_MIN <= refused.failed.retry_after_seconds <= RETRY_MAX and refused.summary is None
    assert answered.failed is None and answered.summary.audio_tokens == 6
    assert metric_value(scrape(stack.ports.metrics["encoder"]), "encoder_speakers") == 0
