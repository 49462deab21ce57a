"""The llm service as a real process loading a checkpoint directory (safetensors with the official
keys, config.json, tokenizer.json) that the test writes."""

import asyncio
import subprocess
import sys
import time

import grpc
import pytest
from conftest import metric_value, scrape
from moss.speech.v1 import common_pb2, llm_pb2, llm_pb2_grpc

from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.engine.engine import EngineConfig, GenerationRequest, LLMEngine
from services.llm.model.checkpoint import random_model, save_pretrained
from services.llm.model.config import tiny_config
from services.llm.model.tokenizer import tiny_tokenizer
from services.stack import free_port, is_serving

GREEDY = common_pb2.SamplingParams(temperature=0.0, max_new_tokens=16, min_new_tokens=0, repetition_penalty=1.0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("moss-tiny")
    model = random_model(tiny_config(), seed=21)
    save_pretrained(model, path)
    tiny_tokenizer(model.cfg).save(str(path / "tokenizer.json"))
    return path, model


@pytest.fixture(scope="module")
def llm(checkpoint, tmp_path_factory):
    path, _ = checkpoint
    port, metrics_port = free_port(), free_port()
    log = open(tmp_path_factory.mktemp("llm-log") / "llm.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "llm", "--port", str(port), "--metrics-port", str(metrics_port),
                             "--model-dir", str(path), "--max-num-batched-tokens", "64"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not is_serving(f"127.0.0.1:{port}"):
            assert proc.poll() is None and time.monotonic() < deadline, "llm did not start"
            time.sleep(0.2)
        yield f"127.0.0.1:{port}", metrics_port
    finally:
        proc.terminate()
        proc.wait(15)


def wait_idle(metrics_port, timeout=10.0) -> str:
    """The metrics text once no request is running or waiting."""
    deadline = time.monotonic() + timeout
    while True:
        text = scrape(metrics_port)
        if metric_value(text, "llm_requests_running") == 0 and metric_value(text, "llm_requests_waiting") == 0:
            return text
        assert time.monotonic() < deadline, "requests still running"
        time.sleep(0.05)


async def generate(target, **fields):
    async with grpc.aio.insecure_channel(target) as channel:
        return [m async for m in llm_pb2_grpc.LlmStub(channel).Generate(llm_pb2.GenerateRequest(**fields), timeout=60)]


def tokens(chunks):
    return [t for c in chunks for t in c.audio_tokens]


def test_checkpoint_directory_serves_the_same_tokens(checkpoint, llm):
    path, model = checkpoint
    chunks = asyncio.run(generate(llm[0], text="Hello there", sampling=GREEDY))
    assert chunks[0].first and chunks[-1].final and chunks[-1].stats.audio_tokens == 16
    engine = LLMEngine(model, tiny_tokenizer(model.cfg), EngineConfig(kv_cache_bytes=1 << 22))
    seq = engine.make_sequence(GenerationRequest("x", SamplingSettings(temperature=0.0, max_new_tokens=16, min_new_tokens=0,
                                                                        repetition_penalty=1.0), ChunkSettings(), text="Hello there"))
    engine.add(seq)
    while engine.has_work():
        engine.step()
    assert tokens(chunks) == seq.audio_ids[seq.num_prompt :]


def test_session_turns_over_grpc_reuse_the_cache(llm):
    """The second turn brings the history the first turn's final chunk reported; the blocks the llm pinned for it
    serve that history, and ReleaseSession lets them go."""
    target, metrics_port = llm
    first = asyncio.run(generate(target, text="Hi", session_id="conv-1", sampling=GREEDY))
    assert metric_value(scrape(metrics_port), "llm_sessions") >= 1
    before = metric_value(scrape(metrics_port), "llm_prefill_tokens_total")
    second = asyncio.run(generate(target, text="More please", session_id="conv-1", sampling=GREEDY,
                                  history=first[-1].turn_tokens))
    computed = metric_value(scrape(metrics_port), "llm_prefill_tokens_total") - before
    assert second[-1].stats.prompt_tokens > len(first[-1].turn_tokens.text) > first[-1].stats.prompt_tokens + 16
    assert 0 < computed < 40 < second[-1].stats.prompt_tokens

    async def release():
        async with grpc.aio.insecure_channel(target) as channel:
            stub = llm_pb2_grpc.LlmStub(channel)
            return [(await stub.ReleaseSession(llm_pb2.ReleaseSessionRequest(session_id="conv-1"))).released
                    for _ in range(2)]

    assert asyncio.run(release()) == [True, False]  # the second: nothing pinned any more


def test_turns_of_one_session_at_once_both_run(llm):
    """The llm keeps no session: a second turn while the first runs is just another request."""
    target, _ = llm

    async def two_turns():
        async with grpc.aio.insecure_channel(target) as channel:
            stub = llm_pb2_grpc.LlmStub(channel)
            sampling = common_pb2.SamplingParams(max_new_tokens=200, min_new_tokens=200, seed=1)
            long_turn = stub.Generate(llm_pb2.GenerateRequest(text="Long", session_id="busy", sampling=sampling))
            await long_turn.read()  # running now
            again = [m async for m in stub.Generate(llm_pb2.GenerateRequest(text="Again", session_id="busy",
                                                                            sampling=GREEDY))]
            rest = []
            while (m := await long_turn.read()) is not grpc.aio.EOF:
                rest.append(m)
            await stub.ReleaseSession(llm_pb2.ReleaseSessionRequest(session_id="busy"))
            return again, rest

    again, rest = asyncio.run(two_turns())
    assert again[-1].final and again[-1].turn_tokens.text and rest[-1].final and rest[-1].stats.generated_tokens == 200


@pytest.mark.parametrize("sampling, field", [
    (common_pb2.SamplingParams(temperature=-0.5), "sampling.temperature"),
    (common_pb2.SamplingParams(top_k=-1), "sampling.top_k"),
    (common_pb2.SamplingParams(max_new_tokens=5000), "sampling.max_new_tokens"),
])
def test_impossible_sampling_is_refused_and_allocates_nothing(llm, sampling, field):
    target, metrics_port = llm
    with pytest.raises(grpc.aio.AioRpcError) as info:
        asyncio.run(generate(target, text="hi", sampling=sampling))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in info.value.details()
    wait_idle(metrics_port)


def test_prompt_longer_than_the_context_is_refused(llm):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        asyncio.run(generate(llm[0], text="x" * 5000))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "context" in info.value.details()


def test_disconnect_frees_blocks_at_once(llm):
    target, metrics_port = llm
    baseline = metric_value(wait_idle(metrics_port), "llm_kv_blocks_used")  # sessions of earlier tests hold some

    async def leave_early():
        async with grpc.aio.insecure_channel(target) as channel:
            long_turn = llm_pb2.GenerateRequest(text="go on", sampling=common_pb2.SamplingParams(max_new_tokens=1500))
            call = llm_pb2_grpc.LlmStub(channel).Generate(long_turn)
            await call.read()
            # (the engine sets the gauge just after it hands out a step's chunks: a client may read one first)
            deadline = time.monotonic() + 5
            while metric_value(scrape(metrics_port), "llm_kv_blocks_used") <= baseline:
                assert time.monotonic() < deadline, "the running turn holds no blocks"
                await asyncio.sleep(0.02)
        # closing the channel ends the call as a vanished client would: the server sees it cancelled

    asyncio.run(leave_early())
    assert metric_value(wait_idle(metrics_port), "llm_kv_blocks_used") == baseline


def test_clients_may_reuse_request_ids(llm):
    """Request ids are the client's labels: two concurrent calls with one id each get their own stream."""
    target, _ = llm

    async def both():
        return await asyncio.gather(generate(target, request_id="same", text="one", sampling=GREEDY),
                                    generate(target, request_id="same", text="two", sampling=GREEDY))

    first, second = asyncio.run(asyncio.wait_for(both(), 60))
    assert first[-1].final and second[-1].final
    assert first[-1].stats.audio_tokens == second[-1].stats.audio_tokens == 16


def test_engine_metrics_are_exported(llm):
    target, metrics_port = llm
    before = metric_value(wait_idle(metrics_port), "llm_prefix_cache_hit_tokens_total")
    asyncio.run(generate(target, text="A question", sampling=GREEDY))
    asyncio.run(generate(target, text="Another question", sampling=GREEDY))  # same system prompt: cached
    text = wait_idle(metrics_port)
    assert metric_value(text, "llm_prefix_cache_hit_tokens_total") > before
    assert metric_value(text, "llm_prefix_cache_queried_tokens_total") >= metric_value(text, "llm_prefix_cache_hit_tokens_total")
    assert metric_value(text, "llm_kv_blocks_used") + metric_value(text, "llm_kv_blocks_free") > 0
    for name in ("llm_preemptions_total", "llm_step_seconds_count", "llm_batch_size_count", "llm_prefill_seconds_count",
                 "llm_time_to_first_audio_token_seconds_count", "llm_requests_waiting", "llm_sessions"):
        assert f"\n{name} " in text, name


def test_a_held_turn_gets_no_tokens_until_released_then_all_of_them(llm):
    """Llm.Hold: the gateway holds a turn whose client stopped taking audio. While held, no chunk comes and the
    gauge counts it; released, the turn goes on to its end, the same tokens as never held."""
    target, metrics_port = llm
    sampling = common_pb2.SamplingParams(temperature=0.0, max_new_tokens=200, min_new_tokens=200, repetition_penalty=1.0)

    async def scenario():
        async with grpc.aio.insecure_channel(target) as channel:
            stub = llm_pb2_grpc.LlmStub(channel)
            call = stub.Generate(llm_pb2.GenerateRequest(request_id="held-1", text="Hello there", sampling=sampling),
                                 timeout=60)
            chunks = [await call.read()]
            found = (await stub.Hold(llm_pb2.HoldRequest(request_id="held-1", held=True))).found
            held_gauge = metric_value(await asyncio.to_thread(scrape, metrics_port), "llm_requests_held")

            async def read_all():  # (a read cancelled would cancel the call: one reader to the end)
                while (msg := await call.read()) is not grpc.aio.EOF:
                    chunks.append(msg)

            reader = asyncio.create_task(read_all())
            await asyncio.sleep(0.3)  # what was sent before the hold took effect...
            during = len(chunks)
            await asyncio.sleep(0.7)  # ... then nothing
            still = len(chunks)
            unknown = (await stub.Hold(llm_pb2.HoldRequest(request_id="nobody", held=True))).found
            with pytest.raises(grpc.aio.AioRpcError) as empty:
                await stub.Hold(llm_pb2.HoldRequest(held=True))
            assert (await stub.Hold(llm_pb2.HoldRequest(request_id="held-1", held=False))).found
            await reader
            return found, held_gauge, (during, still), unknown, empty.value, chunks

    found, held_gauge, during, unknown, empty, chunks = asyncio.run(scenario())
    assert found and held_gauge == 1 and not unknown
    assert empty.code() == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in empty.details()
    assert during[0] == during[1] < len(chunks) and not chunks[during[0] - 1].final  # held: nothing came for 0.7 s
    assert chunks[-1].final and chunks[-1].stats.audio_tokens == 200
    alone = asyncio.run(generate(target, text="Hello there", sampling=sampling))
    assert tokens(chunks) == tokens(alone)
    assert metric_value(wait_idle(metrics_port), "llm_requests_held") == 0
