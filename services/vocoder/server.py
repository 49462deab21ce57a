"""Build the vocoder service from its settings and serve it."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import torch
from moss.speech.v1 import vocoder_pb2, vocoder_pb2_grpc

from services.common.device import fatal_signal, open_context, use_cpu_threads
from services.common.device import lost as device_lost
from services.common.metrics import start_metrics_server
from services.common.server import serve
from services.vocoder import metrics
from services.vocoder.capture import IDLE_SECONDS, BackgroundCapture, DeviceGate, GraphShape, split
from services.vocoder.codec.decoder import FlowTokenDecoder
from services.vocoder.codec.solve import FlowSolve
from services.vocoder.loader import FlowOptions, load_vocoder
from services.vocoder.runner import LAST_WINDOW_BATCH, smallest
from services.vocoder.servicer import VocoderServicer
from services.vocoder.settings import VocoderSettings
from services.vocoder.streamer import DEFAULT_LOOKAHEAD
from services.vocoder.vocoder import TokenVocoder
from services.vocoder.worker import FIRST_CHUNK_LANE_BATCH

log = logging.getLogger(__name__)


def graph_shapes(vocoder: TokenVocoder, lane: TokenVocoder | None, batches: list[int], max_batch: int, left: int,
                 lookahead: int, flow_calls: bool = True) -> list[GraphShape]:
    """Every graph the workers' calls can replay, not captured yet: the generator's for these batch buckets (streams'
    last windows, of the held-back lookahead, its left context and what the token decoder held at the end, at their
    exact lengths in the few batches they come in), the flow's (unless flow_calls is False: the solve's own graphs
    decode), and the first-chunk lane's for its first calls."""
    flow = isinstance(vocoder.decoder, FlowTokenDecoder)
    voices = list(vocoder.voices.values())
    shapes = vocoder.runner.shapes(batches, exact_frames=[left + lookahead + frames for frames in vocoder.end_frames],
                                   exact_batches=[b for b in batches if b <= LAST_WINDOW_BATCH])
    if flow and flow_calls:
        shapes += vocoder.decoder.shapes(voices, max_batch)
    if lane is not None:
        shapes += lane.runner.shapes([b for b in batches if b <= FIRST_CHUNK_LANE_BATCH])
        if flow:
            shapes += lane.decoder.shapes(voices, FIRST_CHUNK_LANE_BATCH, first_calls=True)
    return shapes


def capture_while_serving(shapes: list[GraphShape], gate: DeviceGate, parts: list[TokenVocoder],
                          idle_seconds: float = IDLE_SECONDS) -> BackgroundCapture:
    """The graphs left, captured by a thread of their own through the workers' gate (capture.py), started; the
    workers' vocoders (parts) ask for a graph their call lacks."""
    device = parts[0].device

    def capture_now(shape: GraphShape) -> None:  # (inference mode and the current device are per thread)
        with torch.inference_mode(), torch.cuda.device(device):
            shape.capture()

    background = BackgroundCapture(shapes, gate, capture_now, idle_seconds)
    for v in parts:
        background.watch(v.runner)
        if isinstance(v.decoder, FlowTokenDecoder):
            background.watch(v.decoder.graphs)
    return background.start()


def flow_options(s: VocoderSettings) -> FlowOptions:
    defaults = FlowOptions()
    return FlowOptions(block_tokens=s.flow_block_tokens or defaults.block_tokens,
                       max_context_tokens=s.flow_context_tokens or defaults.max_context_tokens,
                       n_timesteps=s.flow_steps, cfg_rate=s.flow_cfg_rate,
                       history_streams=s.flow_history_streams,
                       history_frames=s.flow_history_frames or defaults.history_frames, max_voices=s.max_voices,
                       encoder_window=s.flow_encoder_window)


def check_overlap(s, solve) -> None:
    """--generator-overlap on pipelines the playing streams' flow calls on a GPU's streams: the solve (--flow-solve on)
    has a worker of its own, and on a CPU, which runs one pass at a time, a call's samples would wait for the next
    call's token decoder (pipelined_worker.py)."""
    if s.generator_overlap != "on":
        return
    if solve is not None:
        raise ValueError("--generator-overlap on pipelines flow calls; with --flow-solve on there are none")
    if s.device != "cuda":
        raise ValueError("--generator-overlap on needs --device cuda: on a CPU a call's samples would wait for the next "
                         "call's token decoder, beside nothing")


async def run(s: VocoderSettings) -> None:
    if s.speaker_model and not Path(s.speaker_model).is_file():
        raise ValueError(f"--speaker-model {s.speaker_model}: no such file (the codec's speaker-embedding model in "
                         "ONNX, CosyVoice2's campplus.onnx)")
    use_cpu_threads("vocoder", s.cpu_threads)
    open_context("vocoder", s.device)
    started = time.perf_counter()
    vocoder = load_vocoder(s.vocoder_dir, s.preset, s.device, s.seed, voices_dir=s.voices_dir, flow=flow_options(s),
                           generator=s.generator or "hift")
    log.info("vocoder: models and voices loaded in %.1f s", time.perf_counter() - started)
    # On CUDA: the graphs every call can replay (capture.py: before serving, or while serving with the workers idle;
    # never by a worker, and never beside a call). A capture at a call's first use stalls every stream in that
    # batch: at the real size, the first sweep to reach 16 streams saw first chunks of ~0.5 s (docs/benchmarks.md).
    started = time.perf_counter()
    left = vocoder.receptive_field[0] if s.left_context is None else s.left_context
    lookahead = DEFAULT_LOOKAHEAD if s.lookahead is None else s.lookahead
    flow = isinstance(vocoder.decoder, FlowTokenDecoder)
    limits = s.call_limits(flow)
    solve = None
    if s.flow_solve == "on":
        if not flow or vocoder.decoder.history is None:
            raise ValueError("--flow-solve on needs the codec's flow decoder with a stream history "
                             "(--flow-history-streams > 0)")
        if s.first_chunk_lane == "on":
            raise ValueError("--flow-solve on and --first-chunk-lane on do not go together: with the solve a first "
                             "chunk joins the running solve at once")
        solve = FlowSolve(vocoder.decoder, s.flow_solve_rows)
    # A call holds at most max_batch windows (with the solve: the rows a tick finishes, and the chunks ready beside
    # them): larger batch buckets are never used.
    most = limits.max_batch if solve is None else max(limits.max_batch, s.flow_solve_rows)
    ceiling = smallest(vocoder.runner.batch_buckets, most) or vocoder.runner.batch_buckets[-1]
    batches = [b for b in vocoder.runner.batch_buckets if b <= ceiling]
    if solve is not None:  # its ticks' and admissions' graphs; streams beyond the history's slots decode eagerly
        solve.warm_up()
    lane = vocoder.lane() if s.first_chunk_lane == "on" else None  # first chunks beside the other calls (worker.py)
    shapes = graph_shapes(vocoder, lane, batches, limits.max_batch, left, lookahead, flow_calls=solve is None)
    # Before serving: every graph, or the covers (and one window's calls: capture.py; the solve's worker takes no gate).
    first, rest = ((shapes, []) if s.graphs_before_serving == "all" or solve is not None
                   else split(shapes, first_calls=s.graphs_before_serving == "first"))
    check_overlap(s, solve)
    with torch.inference_mode():
        for shape in first:
            shape.capture()
    parts = [vocoder] + ([lane] if lane is not None else [])  # the workers' vocoders, each with graphs of its own
    for v in parts:
        v.serve()
    if shapes or solve is not None:
        log.info("vocoder: %d CUDA graphs captured before serving in %.1f s, %d to capture while serving (%s)",
                 sum(len(v.runner.graphs) + len(getattr(v.decoder, "graphs", ())) for v in parts)
                 + len(solve.graphs if solve else ()), time.perf_counter() - started, len(rest),
                 "--graphs-before-serving " + ("all" if not rest else s.graphs_before_serving))
    if getattr(vocoder.decoder, "history", None) is not None:
        metrics.watch_history(vocoder.decoder.history)
    # The workers' device work goes through a gate: graphs captured while serving, and voices added, keep calls away.
    # (The solve's worker takes no gate: with --flow-solve on every graph is captured before serving.)
    gate = DeviceGate() if (rest or flow) and solve is None else None
    fatal, report = fatal_signal(asyncio.get_running_loop())  # the device lost: stop serving, exit (device.py)
    log.info("vocoder: calls of at most %d windows and %d mel frames, %d with a first chunk%s", limits.max_batch,
             limits.max_batch_frames, limits.first_chunk_batch_frames,
             f"; a call led by a chunk due within {s.urgent_seconds:g} s takes only such chunks (--urgent-seconds)"
             if s.urgent_seconds > 0 else "")
    if s.generator_overlap == "on":
        log.info("vocoder: each playing call's generator beside the next call's token decoder (--generator-overlap on)")
    servicer = VocoderServicer(vocoder, s.left_context, s.lookahead, max_batch=limits.max_batch,
                               max_batch_frames=limits.max_batch_frames, first_chunk_budget=s.first_chunk_budget,
                               first_chunk_batch_frames=limits.first_chunk_batch_frames, urgent_seconds=s.urgent_seconds,
                               lost=lambda: device_lost(s.device), on_fatal=report, lane=lane, solve=solve,
                               admit_every=s.flow_admit_every, generate_wait=s.flow_generate_wait, gate=gate,
                               speaker_model=s.speaker_model, overlap=s.generator_overlap == "on")
    background = capture_while_serving(rest, gate, parts) if rest else None
    if background is not None:
        metrics.watch_captures(background)
    start_metrics_server(s.host, s.metrics_port)
    await serve(
        name="vocoder",
        full_service_name=vocoder_pb2.DESCRIPTOR.services_by_name["Vocoder"].full_name,
        host=s.host,
        port=s.port,
        add_servicer=lambda server: vocoder_pb2_grpc.add_VocoderServicer_to_server(servicer, server),
        on_done=metrics.observe_request,
        on_stop=lambda: (background.stop() if background else None, servicer.worker.stop()),
        tls=s.tls,
        fatal=fatal,
        warm=(lambda: background.pending == 0) if background is not None else None,  # every graph captured
    )
