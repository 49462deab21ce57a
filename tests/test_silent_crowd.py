"""A crowd of clients that stop reading denies the llm to nobody: 64 Synthesize calls that never read (4x the CPU
llm's --max-num-seqs of 16) beside 8 clients that read. Each silent turn is held at the llm once its client has left a
message untaken (Llm.Hold): held, it leaves the running batch and keeps its KV, so the readers' turns run; every silent
call ends CANCELLED once --client-stall-seconds pass without a message taken, and everything it held comes back.

Once under API keys (the silent client one key, each reader another), once without keys, every call from this host's
address (loopback: no per-address limit; services/gateway/admission.py)."""

import asyncio
import time

import grpc
import pytest
from conftest import left_held, metric_value, own_gateway, scrape
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from services.stack import Ports, Stack

SILENT, READERS = 64, 8
STALL_SECONDS = 3.0
# 2000 tokens are 160 s of audio: far past what the calls' flow-control windows hold (the silent channels never grow
# theirs), and far past what the unpaced CPU llm makes before the gateway holds the turn (0.5 s after its client left
# a message untaken)
LONG = common_pb2.SamplingParams(max_new_tokens=2000, min_new_tokens=2000)
SHORT = common_pb2.SamplingParams(max_new_tokens=8)


@pytest.fixture(scope="module")
def crowd_stack(tmp_path_factory):
    """llm + vocoder at the CPU defaults (--max-num-seqs 16, no pacing), as the outside probe ran them."""
    with Stack(Ports.free(), log_dir=tmp_path_factory.mktemp("crowd-logs"), without=("encoder",)) as s:
        yield s


def metadata(key):
    return (("authorization", f"Bearer {key}"),) if key else ()


async def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := await asyncio.to_thread(check)):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)
    return value


async def crowd(gateway, stack, silent_key, reader_keys):
    """The silent calls, then the readers once the llm holds more turns than it runs at once → (readers' results,
    seconds from the llm's admitting the last of the crowd to the last silent call's end)."""
    def gw(name, labels=""):
        return metric_value(scrape(gateway.metrics), name, labels)

    def llm(name):
        return metric_value(scrape(stack.ports.metrics["llm"]), name)

    stalled = '{method="Synthesize"}'
    before = gw("gateway_stalled_calls_total", stalled)
    channels = [grpc.aio.insecure_channel(gateway.target, options=[("grpc.http2.bdp_probe", 0)]) for _ in range(8)]
    calls = [gateway_pb2_grpc.GatewayStub(channels[i % 8]).Synthesize(
        gateway_pb2.SynthesizeRequest(text=f"a long reply nobody reads {i}", sampling=LONG), timeout=90,
        metadata=metadata(silent_key)) for i in range(SILENT)]
    # more turns held and running than the llm runs at once: a held turn's running place went to a waiting one. Held
    # turns that kept their running places would fill its batch (the llm used to fail every request it had then,
    # saying its cache was full). (Not 16 held at once: each held turn ends STALL_SECONDS after its client's last
    # take, and on a slow CPU a wave's turns are held over longer than that.)
    await wait_until(lambda: llm("llm_requests_held") and llm("llm_requests_held") + llm("llm_requests_running") > 16,
                     60, "no held turn's running place went to a waiting turn")

    async def read(key, i):
        async with grpc.aio.insecure_channel(gateway.target) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            try:
                replies = [m async for m in stub.Synthesize(gateway_pb2.SynthesizeRequest(
                    text=f"a short question {i}", sampling=SHORT), timeout=60, metadata=metadata(key))]
                return replies[-1].summary
            except grpc.aio.AioRpcError as err:
                return err

    # The llm admits the crowd 16 at a time, as it holds the turns before (on this CPU, a wave every ~2.5 s): a
    # silent call's client has a message to take, and so its stall clock, only once its turn makes audio
    admitted = asyncio.create_task(wait_until(lambda: llm("llm_requests_waiting") == 0 and time.monotonic(), 90,
                                              "the llm never admitted the whole crowd"))
    readers = await asyncio.gather(*(read(key, i) for i, key in enumerate(reader_keys)))
    await wait_until(lambda: gw("gateway_stalled_calls_total", stalled) >= before + SILENT, 60,
                     "the silent calls were not all ended")
    ended = time.monotonic() - await admitted
    for call in calls:  # read at last: what was sent, then CANCELLED saying why
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call:
                pass
        assert info.value.code() == grpc.StatusCode.CANCELLED, info.value
    for channel in channels:
        await channel.close()
    return readers, ended


def check_after(gateway, stack, readers, ended):
    for summary in readers:
        assert isinstance(summary, gateway_pb2.SynthesisSummary) and summary.audio_tokens > 0, summary
    # each silent call is ended once its client has taken nothing for STALL_SECONDS: the last within that plus the
    # time its turn takes to fill the window it never reads (~1.3 s of audio: about a second on an idle CPU, 5 s and
    # more on a slow 2-core one while the readers' turns run beside it, CI's 8.4 s in all) of the crowd's last
    # admission; not the 160 s of audio each asked for, nor its 90 s deadline
    assert ended < STALL_SECONDS + 12, ended
    deadline = time.monotonic() + 15
    while any((held := left_held(gateway, stack)).values()) or metric_value(
            scrape(stack.ports.metrics["llm"]), "llm_requests_held"):
        assert time.monotonic() < deadline, held
        time.sleep(0.1)
    llm_log = (stack.log_dir / "llm.log").read_text()
    assert "ERROR" not in llm_log and "Traceback" not in llm_log and "cannot be admitted" not in llm_log


def test_silent_clients_under_one_key_deny_the_llm_to_nobody(crowd_stack, tmp_path):
    keys = tmp_path / "keys.txt"
    readers = [f"reader-{i}" for i in range(READERS)]
    keys.write_text("\n".join(["silent", *readers]) + "\n")
    with own_gateway(crowd_stack, tmp_path, "--api-keys-file", str(keys),
                     "--client-stall-seconds", str(STALL_SECONDS)) as gateway:
        results, ended = asyncio.run(crowd(gateway, crowd_stack, "silent", readers))
        check_after(gateway, crowd_stack, results, ended)


def test_silent_clients_without_keys_deny_the_llm_to_nobody(crowd_stack, tmp_path):
    with own_gateway(crowd_stack, tmp_path, "--client-stall-seconds", str(STALL_SECONDS)) as gateway:
        results, ended = asyncio.run(crowd(gateway, crowd_stack, None, [None] * READERS))
        check_after(gateway, crowd_stack, results, ended)


def test_silent_clients_do_not_take_a_cpu_stacks_few_turns_from_its_readers(crowd_stack, tmp_path):
    """Admission as `moss-serve up` has it on a CPU (headroom, from a turn per two cores): silent calls held one after
    another take none of the turns the stages play, so readers are served beside them; once the silent calls are
    gone nothing is left held."""
    from services.cli import parser
    from services.up import up_service_args

    flags = up_service_args(parser().parse_args(["up"]))["gateway"]
    assert "headroom" in flags

    async def scenario(gateway):
        def holds():
            return metric_value(scrape(gateway.metrics), "gateway_client_holds_total")

        channel = grpc.aio.insecure_channel(gateway.target, options=[("grpc.http2.bdp_probe", 0)])
        stub, calls = gateway_pb2_grpc.GatewayStub(channel), []
        for i in range(6):  # each admitted while the ones before are held: the stages play none of them
            before = holds()
            calls.append(stub.Synthesize(gateway_pb2.SynthesizeRequest(text=f"nobody reads {i}", sampling=LONG),
                                         timeout=90))
            await wait_until(lambda: holds() > before, 30, f"silent call {i} was never held")

        async def read(i):
            async with grpc.aio.insecure_channel(gateway.target) as own:
                replies = [m async for m in gateway_pb2_grpc.GatewayStub(own).Synthesize(
                    gateway_pb2.SynthesizeRequest(text=f"a short question {i}", sampling=SHORT), timeout=60)]
                return replies[-1].summary

        readers = [await read(i) for i in range(2)]
        for call in calls:  # (their end by --client-stall-seconds is the tests above's)
            call.cancel()
        await channel.close()
        return readers

    with own_gateway(crowd_stack, tmp_path, *flags, "--client-stall-seconds", str(STALL_SECONDS)) as gateway:
        readers = asyncio.run(scenario(gateway))
        assert all(r.audio_tokens > 0 for r in readers), readers
        deadline = time.monotonic() + 15
        while any((held := left_held(gateway, crowd_stack)).values()):
            assert time.monotonic() < deadline, held
            time.sleep(0.1)
