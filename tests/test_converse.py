"""Converse, through three real processes: a session's turns, barge-in (a cancel stops the audio within
100 ms and gives the llm's KV blocks back), a second turn that reuses the session's cache and speaks as a
cold run of the whole history does, and every way a session ends leaves nothing behind."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import wave

import grpc
import pytest
from conftest import gateway_stack, metric_value, scrape
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, vocoder_pb2, vocoder_pb2_grpc
from sessions import Sessions

from services.common.sampling import ChunkSettings, resolve_sampling
from services.gateway.client import converse
from services.llm.engine.engine import EngineConfig, GenerationRequest, LLMEngine
from services.llm.model.checkpoint import random_model
from services.llm.model.config import preset
from services.llm.model.tokenizer import preset_tokenizer

GREEDY = common_pb2.SamplingParams(temperature=0.0, max_new_tokens=24, min_new_tokens=24)
LONG = common_pb2.SamplingParams(max_new_tokens=400, min_new_tokens=400, seed=1)  # many seconds on CPU
IDLE_SECONDS = 3.0  # long enough for every test here to pause between turns


@pytest.fixture(scope="module")
def stack(stack, tmp_path_factory):
    """The shared stack behind a gateway whose sessions end after IDLE_SECONDS idle."""
    with gateway_stack(stack, tmp_path_factory.mktemp("logs"), "--session-idle-seconds", str(IDLE_SECONDS)) as s:
        yield s


def llm_metric(stack, name: str) -> float:
    return metric_value(scrape(stack.ports.metrics["llm"]), name)


def gateway_metric(stack, name: str, labels: str = "") -> float:
    return metric_value(scrape(stack.ports.metrics["gateway"]), name, labels)


def wait_for(predicate, seconds: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_session_speaks_turn_after_turn_and_a_close_frees_it(stack):
    cancels_before = gateway_metric(stack, "gateway_turn_cancels_total")

    async def scenario():
        async with converse(stack.target("gateway"), sampling=GREEDY) as conv:
            first = await conv.say("Hello, who are you?")
            second = await conv.say("Tell me more.")
            sessions_open = gateway_metric(stack, "gateway_active_sessions")
            return conv, first, second, sessions_open

    conv, first, second, sessions_open = asyncio.run(scenario())
    assert conv.session_id and sessions_open == 1
    for turn in (first, second):
        assert turn.summary is not None and turn.cancelled is None
        assert turn.summary.audio_tokens == 24 and turn.sample_rate > 0
        assert sum(len(c) for c in turn.chunks) == turn.summary.num_samples * 2  # PCM16
        assert turn.offsets == sorted(turn.offsets) and turn.offsets[0] == 0
    assert second.summary.prompt_tokens > first.summary.prompt_tokens + 24  # the history is in its prompt
    assert conv.ended.reason == gateway_pb2.SESSION_END_REASON_CLOSED
    # The second turn came as soon as the first's summary did, while its vocoder call was still closing: that
    # tail is no turn to cancel.
    assert gateway_metric(stack, "gateway_turn_cancels_total") == cancels_before
    wait_for(lambda: gateway_metric(stack, "gateway_active_sessions") == 0, what="the session is still open")
    wait_for(lambda: llm_metric(stack, "llm_sessions") == 0 and llm_metric(stack, "llm_kv_blocks_used") == 0,
             what="the llm still keeps the session")


def test_barge_in_stops_the_audio_within_100_ms_and_the_next_turn_works(stack):
    async def scenario():
        async with converse(stack.target("gateway"), sampling=GREEDY) as conv:
            await conv.say("Hi.")  # a finished turn: the session keeps its history's blocks
            idle_blocks = llm_metric(stack, "llm_kv_blocks_used")
            await conv.send("Talk for a long time.", sampling=LONG)
            cancel_sent, busy_blocks, late, cancelled = None, None, [], None
            async for msg in conv.replies():
                kind = msg.WhichOneof("kind")
                if kind == "audio" and cancel_sent is None:  # audio flows: barge in
                    busy_blocks = llm_metric(stack, "llm_kv_blocks_used")
                    await conv.cancel()
                    cancel_sent = time.perf_counter()
                elif kind == "audio":
                    late.append(time.perf_counter() - cancel_sent)
                elif kind == "cancelled":
                    cancelled = (msg, time.perf_counter() - cancel_sent)
            blocks_after = []
            for _ in range(40):  # the llm frees the turn's blocks on its own thread: watch them go
                blocks_after.append(llm_metric(stack, "llm_kv_blocks_used"))
                if blocks_after[-1] == idle_blocks:
                    break
                await asyncio.sleep(0.05)
            after = await conv.say("Are you still there?")
        async with converse(stack.target("gateway"), sampling=GREEDY) as conv:  # the same, never interrupted
            await conv.say("Hi.")
            uninterrupted = await conv.say("Are you still there?")
        return idle_blocks, busy_blocks, late, cancelled, blocks_after, after, uninterrupted

    idle_blocks, busy_blocks, late, cancelled, blocks_after, after, uninterrupted = asyncio.run(scenario())
    assert idle_blocks > 0 and busy_blocks > idle_blocks
    assert cancelled is not None, "no TurnCancelled"
    msg, seconds = cancelled
    assert seconds < 0.1 and msg.cancelled.seconds < 0.1, (seconds, msg.cancelled.seconds)
    assert all(t < 0.1 for t in late), late  # no audio of the turn after the cancel took effect
    assert blocks_after[-1] == idle_blocks, blocks_after  # the cancelled turn's blocks are back
    assert after.summary is not None and after.summary.audio_tokens == 24  # the session goes on
    # The cancelled turn left nothing in the history: the next turn is what it is in a session without it.
    assert after.summary.prompt_tokens == uninterrupted.summary.prompt_tokens
    assert b"".join(after.chunks) == b"".join(uninterrupted.chunks)
    assert gateway_metric(stack, "gateway_turn_cancels_total") >= 1


def local_turns(texts: list[str]):
    """The llm service's engine, rebuilt here as the service builds it (tiny preset, seed 0, CPU float32):
    the session's turns → the last turn's sequence (its prompt is the whole history)."""
    cfg = preset("tiny")
    engine = LLMEngine(random_model(cfg, seed=0), preset_tokenizer(cfg), EngineConfig(kv_cache_bytes=1 << 30))
    seq, sessions = None, Sessions()
    for i, text in enumerate(texts):
        seq = sessions.add(engine, sessions.request(f"t{i}", resolve_sampling(GREEDY, 2048), "local", text=text,
                                                    system_prompt=""))
        sessions.run(engine)
    return seq


def cold_chunks(seq) -> list[list[int]]:
    """seq's whole prompt on a fresh engine (no session, no cached block) → its audio chunks as streamed."""
    cfg = preset("tiny")
    engine = LLMEngine(random_model(cfg, seed=0), preset_tokenizer(cfg), EngineConfig(kv_cache_bytes=1 << 30))
    p = seq.num_prompt
    cold = engine.make_sequence(GenerationRequest("cold", seq.sampling, ChunkSettings(),
                                                  text_ids=seq.text_ids[:p], audio_ids=seq.audio_ids[:p]))
    engine.add(cold)
    chunks = []
    while engine.has_work():
        chunks += [c.audio_tokens for c in engine.step() if c.audio_tokens]
    return chunks


async def vocode(target: str, chunks: list[list[int]]) -> bytes:
    """The vocoder service over these token chunks, as the gateway sends them → PCM16."""
    async with grpc.aio.insecure_channel(target) as ch:
        call = vocoder_pb2_grpc.VocoderStub(ch).Vocode(timeout=60)
        config = vocoder_pb2.VocodeConfig(request_id="cold", format=common_pb2.AUDIO_FORMAT_PCM16)
        await call.write(vocoder_pb2.VocodeRequest(config=config))
        for tokens in chunks:
            await call.write(vocoder_pb2.VocodeRequest(tokens=vocoder_pb2.AudioTokens(tokens=tokens)))
        await call.write(vocoder_pb2.VocodeRequest(end=vocoder_pb2.EndOfTokens()))
        await call.done_writing()
        return b"".join([msg.pcm async for msg in call])


def test_a_second_turn_reuses_the_session_cache_and_speaks_as_a_cold_run_of_the_history(stack):
    texts = ["Hello, who are you?", "Tell me more."]

    async def scenario():
        async with converse(stack.target("gateway"), sampling=GREEDY) as conv:
            first = await conv.say(texts[0])
            before = llm_metric(stack, "llm_prefill_tokens_total")
            second = await conv.say(texts[1])
            computed = llm_metric(stack, "llm_prefill_tokens_total") - before
        return first, second, computed

    first, second, computed = asyncio.run(scenario())
    # Only the new turn was computed (and the few tokens of the reply never fed back): not the history.
    assert second.summary.prompt_tokens > first.summary.prompt_tokens + 24
    assert 0 < computed < second.summary.prompt_tokens - first.summary.prompt_tokens, computed
    # The same history computed from scratch, on an engine of its own, then vocoded: the same audio.
    seq = local_turns(texts)
    assert seq.num_prompt == second.summary.prompt_tokens  # the same history, token for token in length
    cold = asyncio.run(vocode(stack.target("vocoder"), cold_chunks(seq)))
    assert cold == b"".join(second.chunks)


def held(stack) -> dict[str, float]:
    """What the stack still holds for sessions and turns (all zero when idle)."""
    gateway, llm = scrape(stack.ports.metrics["gateway"]), scrape(stack.ports.metrics["llm"])
    return {"gateway sessions": metric_value(gateway, "gateway_active_sessions"),
            "gateway turns": metric_value(gateway, "gateway_active_requests"),
            "llm sessions": metric_value(llm, "llm_sessions"), "KV blocks": metric_value(llm, "llm_kv_blocks_used"),
            "llm running": metric_value(llm, "llm_requests_running"),
            "vocoder streams": metric_value(scrape(stack.ports.metrics["vocoder"]), "vocoder_active_streams")}


def nothing_held(stack) -> bool:
    return not any(held(stack).values())


@pytest.mark.parametrize("ending", ["idle", "half_close", "drop_mid_turn", "close_mid_turn"])
def test_every_way_a_session_ends_frees_everything(stack, ending):
    ended_before = gateway_metric(stack, "gateway_sessions_ended_total", f'{{reason="{ENDED[ending]}"}}')

    async def scenario():
        async with grpc.aio.insecure_channel(stack.target("gateway")) as ch:
            call = gateway_pb2_grpc.GatewayStub(ch).Converse(timeout=60)
            await call.write(gateway_pb2.ConverseRequest(config=gateway_pb2.SessionConfig(sampling=GREEDY)))
            assert (await call.read()).WhichOneof("kind") == "session"
            turn = gateway_pb2.UserTurn(text="Hi there.", sampling=LONG if ending.endswith("mid_turn") else None)
            await call.write(gateway_pb2.ConverseRequest(turn=turn))
            kinds = []
            while (msg := await call.read()) is not grpc.aio.EOF:
                kinds.append(msg.WhichOneof("kind"))
                if kinds[-1] == "summary" and ending == "half_close":
                    await call.done_writing()
                if kinds[-1] == "audio" and ending == "drop_mid_turn":
                    call.cancel()
                    return kinds, None
                if kinds[-1] == "audio" and ending == "close_mid_turn" and "cancelled" not in kinds:
                    await call.write(gateway_pb2.ConverseRequest(close=gateway_pb2.CloseSession()))
            return kinds, await call.code()

    started = time.monotonic()
    kinds, code = asyncio.run(scenario())
    if ending == "idle":  # the turn finished, then nothing: the session ends after IDLE_SECONDS
        assert kinds[-2:] == ["summary", "ended"] and code == grpc.StatusCode.OK
        assert IDLE_SECONDS <= time.monotonic() - started < IDLE_SECONDS + 10
    elif ending == "half_close":
        assert kinds[-2:] == ["summary", "ended"] and code == grpc.StatusCode.OK
    elif ending == "close_mid_turn":
        assert kinds[-2:] == ["cancelled", "ended"] and "summary" not in kinds and code == grpc.StatusCode.OK
    wait_for(lambda: nothing_held(stack), seconds=5, what=f"outlived the session ({ending}): {held(stack)}")
    wait_for(lambda: gateway_metric(stack, "gateway_sessions_ended_total", f'{{reason="{ENDED[ending]}"}}') == ended_before + 1,
             what="the session's end was not counted")


ENDED = {"idle": "idle", "half_close": "client_done", "drop_mid_turn": "aborted", "close_mid_turn": "closed"}


@pytest.mark.parametrize("messages, field", [
    ([gateway_pb2.ConverseRequest(turn=gateway_pb2.UserTurn(text="hi"))], "config"),
    ([gateway_pb2.ConverseRequest(config=gateway_pb2.SessionConfig(voice="nobody"))], "config.voice"),
    ([gateway_pb2.ConverseRequest(config=gateway_pb2.SessionConfig(sampling=common_pb2.SamplingParams(top_p=2.0)))],
     "config.sampling.top_p"),
    ([gateway_pb2.ConverseRequest(config=gateway_pb2.SessionConfig(system_prompt="x" * 2001))], "config.system_prompt"),
    ([gateway_pb2.ConverseRequest(config=gateway_pb2.SessionConfig()), gateway_pb2.ConverseRequest(turn=gateway_pb2.UserTurn(text=" "))],
     "turn.text"),
    ([gateway_pb2.ConverseRequest(config=gateway_pb2.SessionConfig()),
      gateway_pb2.ConverseRequest(turn=gateway_pb2.UserTurn(text="hi", sampling=common_pb2.SamplingParams(max_new_tokens=0)))],
     "turn.sampling.max_new_tokens"),
    ([gateway_pb2.ConverseRequest(config=gateway_pb2.SessionConfig()), gateway_pb2.ConverseRequest(config=gateway_pb2.SessionConfig())],
     "config"),
    ([gateway_pb2.ConverseRequest(config=gateway_pb2.SessionConfig()), gateway_pb2.ConverseRequest()], "kind"),
])
def test_bad_input_ends_the_call_with_invalid_argument_naming_the_field(stack, messages, field):
    async def scenario():
        async with grpc.aio.insecure_channel(stack.target("gateway")) as ch:
            call = gateway_pb2_grpc.GatewayStub(ch).Converse(iter(messages), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in call:
                    pass
            return info.value

    err = asyncio.run(scenario())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith(f"{field}:"), err.details()
    wait_for(lambda: nothing_held(stack), what=f"a refused session left behind: {held(stack)}")


def test_moss_serve_chat_speaks_each_typed_line_to_a_wav_file(stack, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "services.cli", "chat", "--target", stack.target("gateway"), "--out-dir", str(tmp_path),
         "--temperature", "0", "--max-new-tokens", "16"],
        input="Hello there.\n\nHow are you?\n", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "[turn 1: " in out.stdout and "[turn 2: " in out.stdout and "session ended (closed)" in out.stdout, out.stdout
    for n in (1, 2):
        with wave.open(str(tmp_path / f"turn_{n}.wav")) as w:
            assert w.getframerate() > 0 and w.getnframes() > 0
    assert not (tmp_path / "turn_3.wav").exists()  # the empty line was no turn
