"""Runs the BigVGAN generator over windows of mel frames, several streams' windows as one batch.

On CUDA: bfloat16 weights, the fused anti-aliased activation (activation.py), channels-last activations
(channels_last.py: no layout transforms around cuDNN's NHWC convolutions) and one CUDA graph per (batch bucket, frames
bucket), captured by the server (services/vocoder/capture.py: some before it serves, the rest while it serves); once it
serves, a shape not captured yet is padded into a captured graph of more rows, or, with none, runs eagerly (logged:
`_run` says why); outside a server a shape is captured at its first use. On CPU: the same padding and grouping, eager,
float32.

**Padding never mixes streams.** A window is padded to the smallest frames bucket that holds it by
repeating its last frame, so its padded content is a function of the window alone; only windows of the
same frames bucket share a batch (padding rows of the batch axis are zeros and are dropped). A stream's
samples are therefore the same alone or batched, whatever its batch mates. The repeated frames lie after
the window's end, inside the lookahead the streamer holds back; with a lookahead as wide as the
generator's right receptive field they cannot reach a kept sample at all.

**A stream's last window runs at its exact length** (`exact=True`): offline synthesis ends with each
layer's zero padding, which no padding of the mel input reproduces. Almost every stream ends the same
way (its end arrives after its last tokens, leaving the held-back lookahead frames, their left context and what
the token decoder still held: `left_context + lookahead` frames, plus up to 7 tokens' with the codec's flow), so
graphs are captured for those exact lengths too (`exact_frames`, in batches up to `exact_batches`); other last
windows run eagerly. Zero rows on the batch axis do not change a row's samples either way.

**The host never waits for the device before the samples.** A conditioned generator's inputs that are on the host
(HiFT's: where each window's source stands) go in through pinned memory without a synchronisation, so the
generator's work is queued behind the token decoder's while it still runs; a pageable copy would wait for it. Its
outputs come back with the samples, in the one copy a call makes.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import defaultdict
from collections.abc import Callable

import torch

from services.common.cuda_graph import capture
from services.vocoder.capture import GraphShape

log = logging.getLogger(__name__)

FRAME_BUCKETS = (8, 16, 24, 32, 48, 64, 80, 96, 128)
# Steps of at most 1.5x: a call's windows split into one group per frames bucket, and each group's batch is
# padded up to a bucket; with powers of two, groups of 5 or 9 windows ran 8 or 16 rows.
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# Last windows of one length a graph takes: streams end a few at a time, and each length is a graph per batch bucket.
LAST_WINDOW_BATCH = 4


def smallest(buckets, n: int) -> int | None:
    return next((b for b in buckets if b >= n), None)


class GeneratorRunner:
    def __init__(self, generator: torch.nn.Module, hop: int, device: torch.device, dtype: torch.dtype | None = None,
                 graphs: bool | None = None, fuse: bool | None = None, channels_last: bool | None = None,
                 frame_buckets=FRAME_BUCKETS, batch_buckets=BATCH_BUCKETS, cond_dtypes=(), cond_shapes=()):
        cuda = device.type == "cuda"
        self.hop, self.device = hop, device
        self.dtype = dtype or (torch.bfloat16 if cuda else torch.float32)
        self.fused = 0
        if cuda if fuse is None else fuse:
            from services.vocoder.activation import fuse_activations

            # Before the cast: the fused modules keep Snake's alpha and 1/beta in float32 from the weights.
            self.fused = fuse_activations(generator)  # Activation1d modules replaced
        self.generator = generator.to(device=device, dtype=self.dtype).eval()
        self.channels_last = bool(self.fused) if channels_last is None else channels_last
        if self.channels_last:
            from services.vocoder.channels_last import to_channels_last

            to_channels_last(self.generator)  # after the cast: the swapped weights keep their layout
        self.use_graphs = cuda if graphs is None else graphs
        self.frame_buckets, self.batch_buckets = tuple(frame_buckets), tuple(batch_buckets)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.exact_frames: set[int] = set()  # last-window lengths that run in graphs (warm_up)
        self.exact_batch = 0                 # the most last windows of one length a graph takes (warm_up)
        self.pool = None
        # Serving (set by TokenVocoder.serve once the server's warm-up is over): a shape not captured yet is padded
        # into a captured graph of more rows, or else runs eagerly and is logged once (_run says why). Before (tests,
        # benches): captured at first use.
        self.serving = False
        self.eager_shapes: set[tuple[int, int]] = set()
        # Told of a call whose shape is not captured while serving, and whether a captured graph covers it → whether its
        # capture is planned (capture.py: then it comes next, at once if nothing covers it); None: no capture while
        # serving.
        self.on_missing: Callable[[tuple, bool], bool] | None = None
        # A conditioned generator's further inputs per row (dtype, shape after the batch axis): what warm_up
        # captures graphs with. HiFT: its source's phase at an anchor frame, that frame, the frame whose phase
        # it returns, the window's first sample (codec/hift.py).
        self.cond_dtypes, self.cond_shapes = tuple(cond_dtypes), tuple(cond_shapes)
        # The CUDA stream its calls run on, after the caller's stream's work so far (None: the caller's own): a call
        # then runs beside the caller's next work (pipelined_worker.py: the next call's token decoder).
        self.stream: torch.cuda.Stream | None = None

    def lane(self) -> "GeneratorRunner":
        """The same runner for a second worker thread: the generator shared, graphs of its own (worker.py)."""
        other = copy.copy(self)
        other.graphs, other.pool, other.exact_frames, other.exact_batch, other.serving = {}, None, set(), 0, False
        other.eager_shapes, other.on_missing, other.stream = set(), None, None
        return other

    @property
    def num_mels(self) -> int:
        return self.generator.conv_pre.weight.shape[1]

    def _input(self, batch: int, frames: int) -> torch.Tensor:
        """The generator's zeroed input: [batch, num_mels, frames], or [batch, num_mels, 1, frames] channels-last."""
        kw = dict(dtype=self.dtype, device=self.device)
        if self.channels_last:
            from services.vocoder.channels_last import channels_last_input

            return channels_last_input(batch, self.num_mels, frames, **kw)
        return torch.zeros(batch, self.num_mels, frames, **kw)

    # ---- graphs ----------------------------------------------------------------------------------
    def _graph(self, batch: int, frames: int, cond_dtypes=(), cond_shapes=()):
        """The (batch, frames) graph: (graph, [static mel, static conditions...], static output)."""
        key = (batch, frames)
        if key not in self.graphs:
            static_in = [self._input(batch, frames)]
            static_in += [torch.zeros(batch, *shape, dtype=dtype, device=self.device)
                          for dtype, shape in zip(cond_dtypes or self.cond_dtypes, cond_shapes or self.cond_shapes)]
            graph, static_out = capture(lambda: self.generator(*static_in), self.device, self.pool)
            self.pool = graph.pool()  # one pool: a batch's samples are copied out before the next replay
            self.graphs[key] = (graph, static_in, static_out)
        return self.graphs[key]

    @torch.inference_mode()
    def warm_up(self, batches=(1,), exact_frames=(), exact_batches=None) -> None:
        """Capture the graphs of these batch buckets for every frames bucket, and of exact_batches (default: the
        same) for last windows of these exact lengths. A call's last windows are few: a group of more runs as
        several replays."""
        for shape in self.shapes(batches, exact_frames, exact_batches):
            shape.capture()

    def shapes(self, batches=(1,), exact_frames=(), exact_batches=None) -> list[GraphShape]:
        """The graphs warm_up captures, not captured yet (capture.py captures them; none without graphs). The
        exact lengths' windows run in graphs from now on (eagerly while their graph is not captured)."""
        if not self.use_graphs:
            return []
        exact_batches = batches if exact_batches is None else exact_batches
        keys = [(batch, frames) for batch in batches for frames in self.frame_buckets]
        keys += [(batch, frames) for batch in exact_batches for frames in exact_frames]
        if exact_frames and exact_batches:
            self.exact_frames.update(exact_frames)
            self.exact_batch = max(self.exact_batch, max(exact_batches))
        largest = {}  # frames → the most rows planned: the cover of that length's calls (capture.py)
        for batch, frames in keys:
            largest[frames] = max(batch, largest.get(frames, 0))
        return [GraphShape(batch, lambda b=batch, f=frames: self._graph(b, f), (id(self), (batch, frames)),
                           cover=batch == largest[frames])
                for batch, frames in dict.fromkeys(keys) if (batch, frames) not in self.graphs]

    # ---- running ---------------------------------------------------------------------------------
    def __call__(self, windows: list[torch.Tensor], exact: list[bool] | None = None,
                 conditions: list[tuple[torch.Tensor, ...]] | None = None) -> list[torch.Tensor]:
        """windows: mel [num_mels, F_i] each → float32 samples [F_i * hop] each, on the CPU.
        exact[i]: window i is its stream's last (run at its exact length).
        conditions[i]: window i's further inputs, for a generator called as generator(mel, *conditions) that
        returns (samples, *outputs) (HiFT: its source's phase and noise position, codec/hift.py); then each
        window's entry is (samples, [its outputs]), the outputs on the CPU too.
        The groups' samples and outputs come back in one device-to-host copy: one synchronisation a call, however
        many groups it has (each wait is also a chance for the llm's process to take the GPU)."""
        return self.launch(windows, exact, conditions).result()

    @torch.inference_mode()
    def launch(self, windows: list[torch.Tensor], exact: list[bool] | None = None,
               conditions: list[tuple[torch.Tensor, ...]] | None = None) -> "Generation":
        """The call above, queued on the device without waiting for it → its Generation (result(): the samples).
        On `stream`, if set: after what the caller's stream has queued so far (the windows' mel), and the windows'
        memory kept from the caller's stream's allocations until the call has read it."""
        if self.stream is None:
            return self._launch(windows, exact, conditions)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        for tensor in [*windows, *(t for c in conditions or () for t in c)]:
            if tensor.is_cuda:
                tensor.record_stream(self.stream)
        with torch.cuda.stream(self.stream):
            return self._launch(windows, exact, conditions)

    def _launch(self, windows, exact, conditions) -> "Generation":
        exact = exact or [False] * len(windows)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, (mel, last) in enumerate(zip(windows, exact)):
            frames = mel.shape[1]
            bucket = None if last else smallest(self.frame_buckets, frames)
            groups[("bucket", bucket) if bucket else ("exact", frames)].append(i)
        order, pieces, outputs, finite = [], [], [], []
        timing = self._record()
        for (kind, frames), members in groups.items():
            graph = kind == "bucket" or frames in self.exact_frames
            most = self.exact_batch if kind == "exact" and graph else self.batch_buckets[-1]
            for start in range(0, len(members), most):
                part = members[start : start + most]
                conds = [conditions[i] for i in part] if conditions is not None else None
                samples, outs, mel_finite = self._run([windows[i] for i in part], frames, graph, conds)
                finite.append(mel_finite)
                for row, (i, wav) in enumerate(zip(part, samples)):
                    order.append(i)
                    pieces.append(wav[: windows[i].shape[1] * self.hop])
                    outputs.append([o[row] for o in outs])
        if not pieces:
            return Generation(len(windows), conditions is not None)
        if isinstance(timing, tuple):
            timing[1].record()
        flat = [o for outs in outputs for o in outs]
        dev = torch.cat(pieces + [o.reshape(-1).float() for o in flat] + [f.float() for f in finite])
        timing = timing if isinstance(timing, tuple) else time.perf_counter() - timing  # (Generation.seconds)
        host, done = dev, None
        if dev.is_cuda:  # into pinned memory, not blocking: result() waits for this copy alone
            host = torch.empty(dev.shape, dtype=dev.dtype, pin_memory=True)
            host.copy_(dev, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        return Generation(len(windows), conditions is not None, host, done, order, [p.numel() for p in pieces], flat,
                          len(outputs[0]), timing)

    def _record(self):
        """The start of a call's generator work: on CUDA (start recorded now, end to record after it), events, so that
        the host need not wait; elsewhere the clock."""
        if self.device.type != "cuda":
            return time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        return start, end

    def _batched(self, column: tuple[torch.Tensor, ...], batch: int) -> torch.Tensor:
        """One further input, a tensor per window → [batch, ...] on the device, padding rows zero. Host rows go in
        through pinned memory, without waiting for the device (module docstring)."""
        like = column[0]
        if all(c.device.type == "cpu" for c in column):
            staged = torch.zeros(batch, *like.shape, dtype=like.dtype, pin_memory=self.device.type == "cuda")
            staged[: len(column)] = torch.stack(column)
            return staged.to(self.device, non_blocking=True)
        stacked = torch.stack([c.to(self.device, non_blocking=True) for c in column])
        return torch.cat([stacked, stacked.new_zeros(batch - len(column), *like.shape)])

    def _run(self, mels: list[torch.Tensor], frames: int, graph: bool, conds: list[tuple] | None = None):
        """Same-bucket (or same exact length) windows → (float32 samples [len(mels), frames * hop] on the device,
        the generator's further outputs [len(mels), ...] each, whether each window's mel was all finite [len(mels)]),
        copies (the graphs share one memory pool: the next replay may overwrite their outputs). graph: run in the
        (batch bucket, frames) graph, when graphs are on."""
        graph = graph and self.use_graphs
        bucket = smallest(self.batch_buckets, len(mels))
        if graph and self.serving and (bucket, frames) not in self.graphs:
            # Not captured now: a capture syncs the device and forbids other threads' CUDA calls meanwhile, and the
            # other worker (worker.py's lane) is serving. On an H200 the flow's captures while serving failed the
            # lane's calls and then the vocoder (docs/benchmarks.md). Padded into a graph of more rows (a cover: the
            # server captures the largest batch bucket before serving), or else eagerly, unpadded, this call takes
            # longer.
            cover = min((b for b, f in self.graphs if f == frames and b > bucket), default=None)
            planned = self.on_missing is not None and self.on_missing((bucket, frames), cover is not None)
            graph, bucket = cover is not None, cover or bucket
            if not graph and not planned and (bucket, frames) not in self.eager_shapes:
                self.eager_shapes.add((bucket, frames))
                log.warning("vocoder: generator calls of %d windows of %d frames run eagerly: their shape is not "
                            "captured", bucket, frames)
        batch = bucket if graph else len(mels)
        x = self._input(batch, frames)
        rows = x[:, :, 0, :] if self.channels_last else x  # [batch, num_mels, frames], a view
        for row, mel in enumerate(mels):
            n = mel.shape[1]
            rows[row, :, :n] = mel.to(self.device, self.dtype)
            rows[row, :, n:] = rows[row, :, n - 1 : n]  # repeat the last frame (see the module docstring)
        extra = [self._batched(column, batch) for column in zip(*conds)] if conds is not None else []
        if graph:
            cuda_graph, static_in, static_out = self._graph(batch, frames, [e.dtype for e in extra], [e.shape[1:] for e in extra])
            static_in[0].copy_(x)
            for static, e in zip(static_in[1:], extra):
                static.copy_(e)
            cuda_graph.replay()
            y = static_out
        else:
            y = self.generator(x, *extra)
        y, outs = (y[0], y[1:]) if isinstance(y, tuple) else (y, ())
        y = y.reshape(y.shape[0], -1)  # [batch, 1, T] or [batch, 1, 1, T] → [batch, T]
        mel_finite = torch.isfinite(rows[: len(mels)]).flatten(1).all(1)  # [len(mels)]: a NaN or inf came in
        return (y[: len(mels), : frames * self.hop].to(torch.float32, copy=True),
                [o[: len(mels)].clone() for o in outs], mel_finite)


class Generation:
    """A generator call queued on the device: its samples (and further outputs) arrive in pinned host memory."""

    def __init__(self, windows: int, conditioned: bool, host: torch.Tensor | None = None, done=None,
                 order: list[int] = (), sizes: list[int] = (), outputs: list[torch.Tensor] = (), per_window: int = 0,
                 timing=0.0):
        """host: every window's samples, then every further output, then a flag per piece (1: its mel input was all
        finite), flat (done: the event its copy ends with); order: the window of each piece; sizes: each piece's
        samples; outputs: the further outputs on the device (their shapes and types), per_window of them a window;
        timing: its generator work's (seconds, or CUDA events)."""
        self.windows, self.conditioned, self.host, self.done = windows, conditioned, host, done
        self.order, self.sizes, self.outputs, self.per_window = order, sizes, outputs, per_window
        self.timing = timing
        self.mel_finite = [True] * windows  # whether each window's mel input was all finite (known after result())

    def seconds(self) -> float:
        """Its generator work, seconds (on CUDA device time: waits for it)."""
        if not isinstance(self.timing, tuple):
            return self.timing
        self.timing[1].synchronize()
        return self.timing[0].elapsed_time(self.timing[1]) / 1000

    def ready(self) -> bool:
        """Whether result() would not wait."""
        return self.done is None or self.done.query()

    def result(self) -> list:
        """The windows' samples, float32 [F_i * hop] on the CPU each (conditioned: (samples, [outputs]) each); waits
        for the device's copy."""
        if self.host is None:
            return []
        if self.done is not None:
            self.done.synchronize()
        n = len(self.sizes)
        parts = self.host.split(list(self.sizes) + [o.numel() for o in self.outputs] + [n])
        back = iter(o.view(like.shape).to(like.dtype) for o, like in zip(parts[n : n + len(self.outputs)], self.outputs))
        out: list = [None] * self.windows
        for i, wav, finite in zip(self.order, parts[:n], parts[-1].tolist()):
            out[i] = (wav, [next(back) for _ in range(self.per_window)]) if self.conditioned else wav
            self.mel_finite[i] = finite > 0
        return out
