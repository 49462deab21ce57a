"""The playing streams' worker with each call's generator beside the next call's token decoder
(`--generator-overlap on`; off by default until measured in the stack).

A call is two passes on the device, one after the other: the token decoder (the codec's flow) makes the windows' mel,
then the generator (HiFT) makes their samples. VocoderWorker waits for both before it takes its next batch, so one
call's flow never runs beside another's generator. Under load on an H200 the playing worker is never idle (at Poisson
30 turns a second, calls of ~26 windows at 123-128 ms beside the llm), the generator takes ~20% of the vocoder's call
time, and the flow's kernels, bound by their latency, leave most multiprocessors idle (docs/benchmarks.md,
loads-2026-12-02).

Here each call:
1. takes its batch as VocoderWorker does (earliest deadline first, the same limits);
2. queues its token decoder's pass on the vocoder's stream;
3. hands the call before it its samples: that call's generator ran on a stream of its own (runner.py), beside this
   pass;
4. prepares its windows and queues its generator on the generator's stream, after its mel;
5. waits for its token decoder's pass alone, so that the next batch gathers the jobs that came in meanwhile.

A stream sees the order it sees in VocoderWorker: a call's windows are committed (step 3) before the next call prepares
any (step 4), and the next call's token decoder reads only the decoder states that earlier calls' windows left. So for
the same batches the samples are the serial worker's, bit for bit. What changes is when: a call's samples come once its
generator is done beside the next pass, and the next call starts once the pass before it is done. (A call's seconds
in the metrics, on_batch's, run from its start to that hand-over, as they run to its samples in VocoderWorker.)

With no job waiting, the call in flight gets its samples at once (its streams' next chunks wait on them); so it does
when the worker stops. Should the device be lost, its jobs fail with the rest. The device gate (capture.py) sees the
worker's launches and hand-overs, not the generator of a call in flight, which may run while a voice is added (it reads
none of the flow's prefix) and never beside a graph's capture: a capture synchronizes the device before it begins
(services/common/cuda_graph.py), so the call in flight is done, and its graphs' memory pool with it.
"""

from __future__ import annotations

import logging
import time

from services.common.errors import DeviceLost
from services.vocoder.worker import Job, VocoderWorker, Vocoding

log = logging.getLogger(__name__)


class PipelinedWorker(VocoderWorker):
    def __init__(self, vocoder, *args, **kwargs):
        """As VocoderWorker; vocoder.overlap_generator() gives its generator a CUDA stream of its own. (On a CPU the
        order holds with nothing beside anything: a call's samples wait for the next call's token decoder, so the server
        takes this worker on a GPU only.)"""
        self.inflight: tuple[Vocoding, bool] | None = None  # the call whose generator runs beside the next pass; decoded here
        vocoder.overlap_generator()
        super().__init__(vocoder, *args, **kwargs)

    def _take(self) -> list[Job] | None:
        """VocoderWorker's, but the call in flight gets its samples first when no job is waiting (or stopping)."""
        with self.cv:
            idle = self.stopping or not self.pending
        if idle and self.inflight is not None:
            with self._device():
                try:
                    self._hand_over()
                except Exception as exc:  # noqa: BLE001  (its jobs have failed with it; is the device gone?)
                    log.exception("vocoder: a call's generator failed")
                    if self.lost():
                        self._die(DeviceLost(f"its GPU failed ({str(exc).splitlines()[0]}); restarting"), [])
        return super()._take()

    def _run(self, batch: list[Job]) -> None:
        """Steps 2-5 of the module's docstring."""
        started = time.perf_counter()
        decoded = self._decode_tokens(batch)
        timing = self.vocoder.decode_timing()
        self._hand_over()
        call = self._launch(batch, decoded, {id(job): started for job in batch})
        call.decode_timing = timing
        self.inflight = (call, bool(decoded))
        self.vocoder.wait_decoded(timing)

    def _hand_over(self) -> None:
        """The call in flight: its samples to its streams (waits for its generator). Should that fail, its jobs fail
        (with DeviceLost if the device is gone, as VocoderWorker's would), and the error is raised on."""
        if self.inflight is None:
            return
        (call, decoded_here), self.inflight = self.inflight, None
        try:
            self._deliver(call, decoded_here)
        except Exception as exc:
            err = DeviceLost(f"its GPU failed ({str(exc).splitlines()[0]}); restarting") if self.lost() else exc
            for job in call.jobs:
                if not job.future.done():
                    job.future.set_exception(err)
            raise

    def _die(self, err: DeviceLost, batch: list[Job]) -> None:
        call, self.inflight = self.inflight, None
        super()._die(err, batch + (call[0].jobs if call is not None else []))
