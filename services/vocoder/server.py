"""Build the vocoder service from its settings and serve it."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from moss.speech.v1 import vocoder_pb2, vocoder_pb2_grpc

from services.common.device import fatal_signal
from services.common.device import lost as device_lost
from services.common.metrics import start_metrics_server
from services.common.server import serve
from services.common.tls import ServerTls
from services.vocoder import metrics
from services.vocoder.codec.decoder import FlowTokenDecoder
from services.vocoder.runner import smallest
from services.vocoder.servicer import VocoderServicer
from services.vocoder.streamer import DEFAULT_LOOKAHEAD
from services.vocoder.vocoder import FlowOptions, load_vocoder
from services.vocoder.worker import (
    DEFAULT_FIRST_CHUNK_BATCH_FRAMES,
    DEFAULT_FIRST_CHUNK_BUDGET,
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_BATCH_FRAMES,
)

log = logging.getLogger(__name__)


@dataclass
class VocoderSettings:
    host: str = "127.0.0.1"
    port: int = 50053
    metrics_port: int = 9093
    vocoder_dir: str | None = None
    preset: str = "tiny"
    device: str = "cpu"
    left_context: int | None = None   # mel frames; None: the generator's receptive field
    lookahead: int | None = None      # mel frames; None: streamer.DEFAULT_LOOKAHEAD
    max_batch: int = DEFAULT_MAX_BATCH                # windows per model call (worker.py)
    max_batch_frames: int = DEFAULT_MAX_BATCH_FRAMES  # mel frames per model call
    first_chunk_budget: float = DEFAULT_FIRST_CHUNK_BUDGET  # seconds: a first chunk's deadline (worker.py)
    first_chunk_batch_frames: int = DEFAULT_FIRST_CHUNK_BATCH_FRAMES  # mel frames of a call carrying a first chunk
    seed: int = 0
    tls: ServerTls | None = None  # TLS on the gRPC port (mutual with a client CA: only the gateway gets in)
    voices_dir: str | None = None            # the flow's voices (codec/voice.py); None: the codec directory's
    generator: str | None = None             # with a codec directory: "hift" (None) or "bigvgan"
    flow_block_tokens: int | None = None     # None: codec/decoder.py's defaults and the checkpoint's steps and rate
    flow_context_tokens: int | None = None
    flow_steps: int | None = None
    flow_cfg_rate: float | None = None

    def flow_options(self) -> FlowOptions:
        defaults = FlowOptions()
        return FlowOptions(block_tokens=self.flow_block_tokens or defaults.block_tokens,
                           max_context_tokens=self.flow_context_tokens or defaults.max_context_tokens,
                           n_timesteps=self.flow_steps, cfg_rate=self.flow_cfg_rate)


async def run(s: VocoderSettings) -> None:
    vocoder = load_vocoder(s.vocoder_dir, s.preset, s.device, s.seed, voices_dir=s.voices_dir, flow=s.flow_options(),
                           generator=s.generator or "hift")
    # On CUDA: capture every (batch, frames) graph before serving. A capture on first use stalls every stream
    # in that batch: at the real size, the first sweep to reach 16 streams saw first chunks of ~0.5 s
    # (docs/benchmarks.md, issue 9).
    # Streams end with a window of the held-back lookahead and its left context: that length runs in graphs too.
    started = time.perf_counter()
    left = vocoder.receptive_field[0] if s.left_context is None else s.left_context
    lookahead = DEFAULT_LOOKAHEAD if s.lookahead is None else s.lookahead
    # A call holds at most max_batch windows: larger batch buckets are never used.
    ceiling = smallest(vocoder.runner.batch_buckets, s.max_batch) or vocoder.runner.batch_buckets[-1]
    batches = [b for b in vocoder.runner.batch_buckets if b <= ceiling]
    vocoder.runner.warm_up(batches, exact_frames=(left + lookahead,))
    if isinstance(vocoder.decoder, FlowTokenDecoder):  # the flow's graphs: every (batch, token bucket) a call can use
        vocoder.decoder.warm_up(list(vocoder.voices.values()), s.max_batch)
    if vocoder.runner.graphs:
        flow_graphs = len(getattr(vocoder.decoder, "graphs", {}))
        log.info("vocoder: %d CUDA graphs captured in %.1f s (%d of the flow)", len(vocoder.runner.graphs) + flow_graphs,
                 time.perf_counter() - started, flow_graphs)
    fatal, report = fatal_signal(asyncio.get_running_loop())  # the device lost: stop serving, exit (device.py)
    servicer = VocoderServicer(vocoder, s.left_context, s.lookahead, max_batch=s.max_batch,
                               max_batch_frames=s.max_batch_frames, first_chunk_budget=s.first_chunk_budget,
                               first_chunk_batch_frames=s.first_chunk_batch_frames,
                               lost=lambda: device_lost(s.device), on_fatal=report)
    start_metrics_server(s.host, s.metrics_port)
    await serve(
        name="vocoder",
        full_service_name=vocoder_pb2.DESCRIPTOR.services_by_name["Vocoder"].full_name,
        host=s.host,
        port=s.port,
        add_servicer=lambda server: vocoder_pb2_grpc.add_VocoderServicer_to_server(servicer, server),
        on_done=metrics.observe_request,
        on_stop=servicer.worker.stop,
        tls=s.tls,
        fatal=fatal,
    )
