"""Build the encoder service from its settings and serve it."""

from __future__ import annotations

import logging
import time

import torch
from moss.speech.v1 import encoder_pb2, encoder_pb2_grpc

from services.common.device import open_context, use_cpu_threads
from services.common.memory import Pool, size_pool
from services.common.metrics import start_metrics_server
from services.common.read_ahead import ReadAhead
from services.common.server import serve
from services.encoder import metrics
from services.encoder.checkpoint import load_tokenizer, random_tokenizer
from services.encoder.config import SAMPLE_RATE, glm4_voice, tiny
from services.encoder.kv_pool import KVPool
from services.encoder.servicer import EncoderServicer
from services.encoder.settings import EncoderSettings, default_speakers
from services.encoder.stream import EncoderStream
from services.encoder.whisper_vq import WhisperVQEncoder

log = logging.getLogger(__name__)


# The encoder's weights read (or built) on the CPU ahead of a start, by (directory, preset, seed): a spare's.
MODEL = ReadAhead("the encoder's weights")


def model_ahead(s: EncoderSettings) -> bool:
    """Read the encoder's weights on the CPU now, for load_encoder's next call with these settings to take (a spare's
    work: read_ahead.py). Touches no GPU."""
    return MODEL.read((s.encoder_dir, s.preset, s.seed), lambda: _cpu_model(s))


def _cpu_model(s: EncoderSettings) -> WhisperVQEncoder:
    if s.encoder_dir:
        return load_tokenizer(s.encoder_dir)
    return random_tokenizer(glm4_voice() if s.preset == "moss-speech" else tiny(), s.seed)


def load_encoder(s: EncoderSettings) -> WhisperVQEncoder:
    """The tokenizer's encoder from --encoder-dir, or the preset with random weights; bf16 on CUDA."""
    model = MODEL.take((s.encoder_dir, s.preset, s.seed), lambda: _cpu_model(s))
    if not s.encoder_dir:
        log.warning("encoder: no --encoder-dir: the %r preset with RANDOM weights", s.preset)
    device = torch.device(s.device)
    return model.to(device, torch.bfloat16 if device.type == "cuda" else torch.float32)


def warm_up(servicer: EncoderServicer) -> None:
    """One speaker's second of noise and its end, encoded before serving: the first turn then pays no kernel
    compilation (Triton's attention on CUDA) and the voice-activity model has run once."""
    started = time.perf_counter()
    stream = EncoderStream(servicer.model, servicer.pool)
    noise = torch.randn(SAMPLE_RATE) * 0.1
    stream.feed(noise)
    stream.finish()
    from services.encoder.vad import VadStream

    servicer.vad.probabilities(VadStream(), noise.numpy()).result()
    log.info("encoder: warmed up in %.1f s", time.perf_counter() - started)


PLACES = Pool("encoder", "the speakers' keys and values", "--max-speakers", "speakers")


def speaker_places(model: WhisperVQEncoder, s: EncoderSettings) -> KVPool:
    """The speakers' keys and values (--max-speakers places, or as many as the device's memory holds: memory.py) and,
    on CUDA, the layers' graphs over them."""
    w = model.codebook.weight
    graphs = w.is_cuda and s.cuda_graphs == "on"
    per_place = KVPool.bytes_per_slot(model.cfg, w.dtype)
    places = size_pool(PLACES, per_place, s.max_speakers, default_speakers(s.device), w.device)
    log.info("encoder: %d speaker places (%s; %.0f MB each, %.1f GB in all)", places,
             "--max-speakers" if s.max_speakers is not None else f"the default on {w.device.type}, within half the free memory",
             per_place / 1e6, places * per_place / 1e9)
    pool = KVPool(model.cfg, places, w.device, w.dtype, scratch=graphs)
    if graphs:
        started = time.perf_counter()
        model.capture(pool, s.speakers_per_call)
        log.info("encoder: %d CUDA graphs of the layers captured in %.1f s", len(model.graphs.graphs),
                 time.perf_counter() - started)
    return pool


async def run(s: EncoderSettings) -> None:
    use_cpu_threads("encoder", s.cpu_threads)
    open_context("encoder", s.device)
    model = load_encoder(s)
    servicer = EncoderServicer(model, s, speaker_places(model, s))
    warm_up(servicer)
    start_metrics_server(s.host, s.metrics_port)
    await serve(
        name="encoder",
        full_service_name=encoder_pb2.DESCRIPTOR.services_by_name["Encoder"].full_name,
        host=s.host,
        port=s.port,
        add_servicer=lambda server: encoder_pb2_grpc.add_EncoderServicer_to_server(servicer, server),
        on_done=metrics.observe_request,
        on_stop=servicer.stop,
        tls=s.tls,
    )
