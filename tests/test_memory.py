"""What a service allocates at start fits the memory its device has free, or the service refuses at once saying what
and how much (services/common/memory.py): the llm's weights and KV cache, the flow's stream history, the encoder's
speaker places. At the real size on a 24 GB CPU host, a vocoder that sized its stream history for a GPU was killed by
the kernel's OOM killer without a word; here each service at the real-size preset either serves (its pools sized
down) or exits within seconds naming the pool, its size and the free memory. The sizes the vocoder chose reach the
gateway, which admits no more turns at once than its vocoders have stream slots."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest
import torch
from conftest import metric_value, scrape
from moss.speech.v1 import vocoder_pb2, vocoder_pb2_grpc

from services.common import memory
from services.common.memory import FREE_ENV, NotEnoughMemory, Pool, check_weights, size_gib, size_pool
from services.stack import NO_SPEECH, Ports, Stack

POOL = Pool("vocoder", "the flow's stream history", "--flow-history-streams", "streams")
HOST = 24e9  # a 24 GB host's free memory, as the services are told it


@pytest.fixture
def free(monkeypatch):
    def set_free(n: float) -> None:
        monkeypatch.setenv(FREE_ENV, str(int(n)))
    return set_free


def test_a_default_pool_takes_what_half_the_free_memory_holds(free, caplog):
    free(10e9)
    assert size_pool(POOL, per_item=int(1e9), given=None, default=8, device="cpu") == 5
    assert "holds 5 streams, not 8: 1.0 GB each, and 10.0 GB is free on cpu" in caplog.text
    assert size_pool(POOL, per_item=int(1e8), given=None, default=8, device="cpu") == 8  # room for all: the default
    assert size_pool(POOL, per_item=int(20e9), given=None, default=8, device="cpu", least=0) == 0
    with pytest.raises(NotEnoughMemory, match="needs 20.0 GB at least"):
        size_pool(POOL, per_item=int(20e9), given=None, default=8, device="cpu")


def test_a_given_size_that_does_not_fit_is_refused_with_the_arithmetic(free):
    free(10e9)
    assert size_pool(POOL, per_item=int(1e9), given=9, default=8, device="cpu") == 9  # given: taken if it fits
    with pytest.raises(NotEnoughMemory) as err:
        size_pool(POOL, per_item=int(186e6), given=128, default=128, device="cpu")
    assert str(err.value) == ("vocoder: the flow's stream history for 128 streams needs 23.8 GB (186 MB each), and "
                              "10.0 GB is free on cpu: give --flow-history-streams 48 or less")
    kv = Pool("llm", "the KV cache", "--kv-cache-gb", "GiB")
    assert size_gib(kv, None, 1.0, "cpu") == 1.0 and size_gib(kv, 4.0, 1.0, "cpu") == 4.0
    with pytest.raises(NotEnoughMemory, match=r"the KV cache of 32 GiB needs 34.4 GB, and 10.0 GB is free on cpu: "
                                              r"give --kv-cache-gb 8.3 or less"):
        size_gib(kv, 32.0, 1.0, "cpu")
    free(1e9)
    assert size_gib(kv, None, 1.0, "cpu") == pytest.approx(0.5e9 / (1 << 30))
    with pytest.raises(NotEnoughMemory, match="llm: the weights need 36.4 GB, and 1.0 GB is free on cpu: buy more"):
        check_weights("llm", "the weights", int(36.4e9), "cpu", "buy more")


def test_the_host_reading_is_the_smaller_of_meminfo_and_a_cgroups_room(monkeypatch):
    monkeypatch.delenv(FREE_ENV, raising=False)
    monkeypatch.setattr(memory, "_meminfo", lambda field: 20_000_000_000)
    monkeypatch.setattr(memory, "_cgroup_room", lambda: None)
    assert memory.free_bytes("cpu") == 20_000_000_000
    monkeypatch.setattr(memory, "_cgroup_room", lambda: 3_000_000_000)  # a container's --memory
    assert memory.free_bytes("cpu") == 3_000_000_000


def refused(args: list[str], free_bytes: float = HOST) -> str:
    """A service started with `args` on the CPU, told that `free_bytes` are free: it must exit at once, saying why."""
    proc = subprocess.run([sys.executable, "-m", "services.cli", *args, "--device", "cpu", "--port", "0",
                           "--metrics-port", "0"], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, FREE_ENV: str(int(free_bytes))})
    assert proc.returncode == 2, proc.stderr[-2000:]
    return proc.stderr.strip().splitlines()[-1]


def test_the_real_size_llm_on_a_24_gb_host_says_its_weights_do_not_fit():
    line = refused(["llm", "--preset", "moss-speech"])
    assert line == ("moss-serve llm: cannot start: llm: the weights (9.10 B parameters in float32) need 36.4 GB, and "
                    "24.0 GB is free on cpu: give --dtype bfloat16 (half of float32's), or serve it on a GPU "
                    "(--device cuda)")


def test_a_kv_cache_that_does_not_fit_is_refused():
    line = refused(["llm", "--preset", "tiny", "--kv-cache-gb", "64"])
    assert "llm: the KV cache of 64 GiB needs 68.7 GB, and 24.0 GB is free on cpu: give --kv-cache-gb 20.1 or less" \
        in line


def test_the_real_size_vocoder_with_a_gpus_stream_history_is_refused_on_a_24_gb_host():
    line = refused(["vocoder", "--preset", "moss-speech", "--flow-history-streams", "128"])
    assert line.startswith("moss-serve vocoder: cannot start: vocoder: the flow's stream history for 128 streams "
                           "needs 23.8 GB (186 MB each), and 24.0 GB is free on cpu: give --flow-history-streams 116 "
                           "or less")


def test_a_history_that_does_not_fit_is_refused_before_the_voices_run_through_the_flow(monkeypatch):
    """The refusal comes before the voices' prompts are recorded (at the real size on a CPU that recording is ~16 s of
    a start that can only fail); with room, the same start records them."""
    from services.vocoder.codec.prefix import PromptPrefix
    from services.vocoder.loader import FlowOptions, load_vocoder

    recorded = []
    record = PromptPrefix._record
    monkeypatch.setattr(PromptPrefix, "_record", lambda self, *a: (recorded.append(a[1].name), record(self, *a))[1])
    monkeypatch.setenv(FREE_ENV, str(1 << 20))
    with pytest.raises(NotEnoughMemory, match="the flow's stream history for 1000 streams"):
        load_vocoder(None, "tiny-codec", flow=FlowOptions(history_streams=1000))
    assert recorded == []
    monkeypatch.delenv(FREE_ENV)
    assert load_vocoder(None, "tiny-codec", flow=FlowOptions(history_streams=2)).decoder.history.streams == 2
    assert recorded


def test_the_real_size_encoder_with_more_places_than_fit_is_refused():
    line = refused(["encoder", "--preset", "moss-speech", "--max-speakers", "1000"])
    assert line == ("moss-serve encoder: cannot start: encoder: the speakers' keys and values for 1000 speakers needs "
                    "245.8 GB (246 MB each), and 24.0 GB is free on cpu: give --max-speakers 87 or less")


def test_a_vocoder_sizes_its_history_to_its_memory_and_the_gateway_follows(tmp_path):
    """Told it has room for ten streams' histories, the vocoder keeps five (half the free memory), says so, and the
    gateway admits at most five turns at once."""
    from services.vocoder.codec.history import StreamHistory
    from services.vocoder.loader import FlowOptions, load_vocoder

    decoder = load_vocoder(None, "tiny-codec", flow=FlowOptions(history_streams=1)).decoder
    per_stream = StreamHistory.bytes_per_stream(decoder.flow.decoder.estimator, decoder.prefix)
    env = {"vocoder": {FREE_ENV: str(10 * per_stream)}}
    with Stack(Ports.free(), without=NO_SPEECH, log_dir=tmp_path, env=env,
               extra_args={"vocoder": ["--preset", "tiny-codec"]}) as stack:
        with grpc.insecure_channel(stack.target("vocoder")) as channel:
            reply = vocoder_pb2_grpc.VocoderStub(channel).ListVoices(vocoder_pb2.ListVoicesRequest(), timeout=10)
        assert reply.stream_slots == 5
        assert metric_value(scrape(stack.ports.metrics["gateway"]), "gateway_admission_limit") == 5
    assert "the flow's stream history holds 5 streams, not 128" in (tmp_path / "vocoder.log").read_text()


def test_the_sizes_planned_are_the_sizes_allocated():
    """What the services plan with (bytes_per_stream, bytes_per_slot) is what one more stream or slot allocates."""
    from services.encoder.checkpoint import random_tokenizer
    from services.encoder.config import tiny as encoder_tiny
    from services.encoder.kv_pool import KVPool
    from services.vocoder.codec.history import StreamHistory
    from services.vocoder.loader import FlowOptions, load_vocoder

    decoder = load_vocoder(None, "tiny-codec", flow=FlowOptions(history_streams=1)).decoder
    estimator, prefix = decoder.flow.decoder.estimator, decoder.prefix

    def history_bytes(streams: int) -> int:
        h = StreamHistory(estimator, prefix, streams)
        return sum(t.numel() * t.element_size() for t in (h.keys, h.values, *h.lefts))

    assert history_bytes(3) - history_bytes(2) == StreamHistory.bytes_per_stream(estimator, prefix)
    cfg = random_tokenizer(encoder_tiny(), 0).cfg

    def pool_bytes(slots: int) -> int:
        pool = KVPool(cfg, slots)
        return pool.k.numel() * pool.k.element_size() + pool.v.numel() * pool.v.element_size()

    assert pool_bytes(3) - pool_bytes(2) == KVPool.bytes_per_slot(cfg, torch.float32)


def test_the_encoders_places_default_to_the_streams_a_gpu_stack_plays_and_say_so(caplog):
    """On a GPU a place for every stream the stack plays (the vocoder's history slots, the gateway's turns), on a CPU
    32; the count, why, and the memory it takes in the encoder's log."""
    import logging

    from services.encoder.checkpoint import random_tokenizer
    from services.encoder.config import tiny as encoder_tiny
    from services.encoder.kv_pool import KVPool
    from services.encoder.server import speaker_places
    from services.encoder.settings import EncoderSettings, default_speakers
    from services.settings import GPU_STACK_STREAMS
    from services.vocoder.codec.decoder import DEFAULT_HISTORY_STREAMS

    assert default_speakers("cuda") == default_speakers("cuda:1") == GPU_STACK_STREAMS == DEFAULT_HISTORY_STREAMS == 128
    assert default_speakers("cpu") == 32
    model = random_tokenizer(encoder_tiny(), 0)
    with caplog.at_level(logging.INFO, logger="services.encoder.server"):
        pool = speaker_places(model, EncoderSettings())
    assert pool.slots == 32
    per = KVPool.bytes_per_slot(model.cfg, torch.float32)
    assert f"encoder: 32 speaker places (the default on cpu, within half the free memory; {per / 1e6:.0f} MB each" in caplog.text
    with caplog.at_level(logging.INFO, logger="services.encoder.server"):
        speaker_places(model, EncoderSettings(max_speakers=3))
    assert "encoder: 3 speaker places (--max-speakers;" in caplog.text
