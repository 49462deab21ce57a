"""Each stream's solved frames kept through the flow, so that a call solves only the stream's new frames.

In streaming mode a frame depends on its own attention chunk and the chunks before it only (prefix.py). The
reference therefore decodes each block again over a window of the latest 40 tokens: at the gateway's chunks of
20 tokens a row solves ~170 frames to keep 80 (the prompt's prefix aside). Here a stream's frames are solved once:
each call keeps, at every Euler step and for both rows of the CFG pair, what the stream's later frames read of
its new ones (each attention's keys and values, each causal convolution's last input frames), and the next call
solves only the frames after them, reading [voice prefix | the stream's kept frames | its own]. With every frame
kept this is the offline decode in streaming mode, exactly (tests/test_codec_history.py); the ring keeps a
stream's last `ring` frames (default 40, two attention chunks), and older ones reach the new frames through them,
as in a recurrent transformer, not directly.

Memory per stream: 2 rows x steps x attentions x (keys + values) x heads·head_dim x ring; at the real size
(56 attentions, 10 steps, 8 x 64) 2.24 MB per frame, 92 MB at the default ring of 40 frames. A fixed number of
streams hold one (`streams`); a stream that finds none free is decoded over the window as before.

Layout:
- keys, values [attentions, steps, 2·(streams + 1), heads, ring, head_dim]: slot s's CFG pair at rows 2s, 2s+1;
  the last slot is scratch, where the batch's padding rows write;
- lefts[conv] [steps, 2·voices + 2 banks x 2·(streams + 1), k-1, C]: first the voice prefix's last frames
  (prefix.py's, a copy, for every place of its capacity: what a stream's first call reads; a voice added later is
  copied in by `copy_voice`), then two banks per slot: a call reads one and writes the other, so that no row reads
  what another writes in the same kernel.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from services.vocoder.codec.estimator import Attention
from services.vocoder.codec.prefix import PromptPrefix, StepRows

DEFAULT_RING_FRAMES = 40


@dataclass
class HistoryRows:
    """Where a call's B rows are in the history, each [B] long on the device: `slot` (the scratch slot for a padding
    row), `count` (frames in its ring), `at` (the ring place of its first new frame), `bank` (the lefts it reads:
    -1 for the voice prefix's, a stream's first call) and `keep_bank` (the lefts it writes)."""

    slot: torch.Tensor
    count: torch.Tensor
    at: torch.Tensor
    bank: torch.Tensor
    keep_bank: torch.Tensor


class StreamHistory:
    recording = False  # (flow.py tells a PromptPrefix's Recorder by it)

    @staticmethod
    def bytes_per_stream(estimator, prefix: PromptPrefix, ring: int = DEFAULT_RING_FRAMES) -> int:
        """What one slot costs (the layout above: a CPU in float32 pays twice a GPU's bf16), for sizing `streams`
        before any is allocated (services/common/memory.py)."""
        p = prefix.keys[0]
        attn = estimator.slots(Attention)[0]
        d = attn.to_q.out_features // attn.heads
        keys_values = 2 * len(prefix.keys) * prefix.steps * 2 * attn.heads * ring * d  # a CFG pair's rows
        lefts = sum(prefix.steps * 4 * stacked[0, 0].numel() for stacked in prefix.lefts)  # two banks of a pair
        return (keys_values + lefts) * p.element_size()

    def __init__(self, estimator, prefix: PromptPrefix, streams: int, ring: int = DEFAULT_RING_FRAMES):
        """estimator: the flow's (its attentions' sizes); prefix: the voices' (a stream's first call reads it)."""
        if streams < 1 or ring < 1:
            raise ValueError(f"stream history: streams ({streams}) and ring ({ring}) must be >= 1")
        self.prefix, self.streams, self.ring = prefix, streams, ring
        p = prefix.keys[0]
        steps, rows, voices = prefix.steps, 2 * (streams + 1), prefix.capacity
        attn = estimator.slots(Attention)[0]
        heads, d = attn.heads, attn.to_q.out_features // attn.heads
        shape = (len(prefix.keys), steps, rows, heads, ring, d)
        self.keys, self.values = p.new_zeros(shape), p.new_zeros(shape)
        self.lefts = [torch.cat([stacked, p.new_zeros(steps, 2 * rows, *stacked.shape[2:])], 1)
                      for stacked in prefix.lefts]
        self.voice_rows = 2 * voices
        self.scratch = streams
        self.free = list(range(streams - 1, -1, -1))
        self.owner: dict[int, int] = {}           # stream id → slot
        self.released: list[int] = []             # stream ids let go from another thread, freed by a later call
        self.in_flight: dict[int, int] = {}       # stream id → calls of it being queued (worker lanes: worker.py)
        self.done: dict = {}                      # stream id → the event its last call's device work ends with
        self.lock = threading.Lock()
        self.encoder = None                       # encoder_state.EncoderStore: the slots' encoder state, if kept

    def copy_voice(self, i: int) -> None:
        """The prefix's place i, recorded since (a voice added while serving): its last frames into the copy a
        stream's first call reads (prefix.add calls this before the voice is found)."""
        for mine, theirs in zip(self.lefts, self.prefix.lefts):
            mine[:, 2 * i : 2 * i + 2] = theirs[:, 2 * i : 2 * i + 2]

    # ---- slots (from the vocoder's worker threads: under the lock) --------------------------------------
    def acquire(self, stream: int) -> int | None:
        """A slot for a stream's first call; None when every slot is held."""
        with self.lock:
            if stream in self.owner:
                return self.owner[stream]
            if not self.free:
                return None
            self.owner[stream] = slot = self.free.pop()
            return slot

    def holds(self, stream: int, slot: int) -> bool:
        with self.lock:
            return self.owner.get(stream) == slot

    def release(self, stream: int) -> None:
        """Let a stream's slot go once no call is writing it: none running on a thread (a second worker lane), none
        still running on the GPU (its last call's event). From any thread: a stream ended, or cancelled while a call
        of it may be running."""
        with self.lock:
            self.released.append(stream)

    def begin(self, streams) -> None:
        """A call of these streams starts (the decoder, before it): the slots let go are freed first, where they
        can be."""
        with self.lock:
            self._collect()
            for stream in streams:
                self.in_flight[stream] = self.in_flight.get(stream, 0) + 1

    def end(self, streams, done=None) -> None:
        """The call is queued on the device; done: an event its work completes with (None: already complete)."""
        with self.lock:
            for stream in streams:
                self.in_flight[stream] -= 1
                if not self.in_flight[stream]:
                    del self.in_flight[stream]
                if done is not None:
                    self.done[stream] = done

    def _collect(self) -> None:
        released, self.released = self.released, []
        for stream in released:
            event = self.done.get(stream)
            if self.in_flight.get(stream) or (event is not None and not event.query()):
                self.released.append(stream)        # a call may still write its slot: later
                continue
            self.done.pop(stream, None)
            slot = self.owner.pop(stream, None)
            if slot is not None:
                self.free.append(slot)

    @property
    def held(self) -> int:
        """Slots held (after freeing those let go that can be)."""
        with self.lock:
            self._collect()
            return len(self.owner)

    # ---- a call --------------------------------------------------------------------------------------
    def lefts_row(self, slot: torch.Tensor, bank: torch.Tensor) -> torch.Tensor:
        """[B] slots and banks (0 or 1) → the cond row of each in the lefts (the free row is the next)."""
        return self.voice_rows + 2 * (bank * (self.streams + 1) + slot)

    def view(self, voice_index: torch.Tensor, rows: HistoryRows, lengths: torch.Tensor) -> "HistoryView":
        """What a call's estimator reads and writes; rows in the order of the estimator's batch (cond, then free).
        lengths [B]: each row's new frames."""
        return HistoryView(self, voice_index, rows, lengths)


class HistoryView(StepRows):
    """The estimator's side of a call: its rows' prefix, kept frames and lefts, at the solver's Euler step (`step`: an
    int, or each row's own, [B] long: prefix.StepRows)."""

    def __init__(self, history: StreamHistory, voice_index: torch.Tensor, rows: HistoryRows, lengths: torch.Tensor):
        super().__init__()
        self.history = history

        self.voice_rows = history.prefix.view(voice_index).rows     # [2B]: each row's voice in the prefix
        self.slots = torch.cat([2 * rows.slot, 2 * rows.slot + 1])  # its CFG pair's rows in the rings
        self.count, self.at = rows.count.repeat(2), rows.at.repeat(2)
        first = rows.bank < 0                                          # a stream's first call: the voice's lefts
        reads = torch.where(first, 2 * voice_index, history.lefts_row(rows.slot, rows.bank.clamp(min=0)))
        self.reads = torch.cat([reads, reads + 1])
        keeps = history.lefts_row(rows.slot, rows.keep_bank)
        self.keeps = torch.cat([keeps, keeps + 1])
        self.lengths = lengths.to(torch.int32).repeat(2)

    def kv(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> dict:
        """What an attention reads before the rows' own keys: the voice prefix's, then the stream's kept ones."""
        h, prefix = self.history, self.history.prefix
        keys, voice_rows = self.at_step(prefix.keys[slot], self.voice_rows)
        ring_keys, slots = self.at_step(h.keys[slot], self.slots)
        return dict(prefix=(keys, self.at_step(prefix.values[slot], self.voice_rows)[0], voice_rows),
                    history=(ring_keys, self.at_step(h.values[slot], self.slots)[0], slots, self.count))

    def keep(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> tuple:
        """The rows' new keys and values into their rings, once the attention has read them (frame_norm's keep)."""
        h = self.history
        ring_keys, slots = self.at_step(h.keys[slot], self.slots)
        return k, v, ring_keys, self.at_step(h.values[slot], self.slots)[0], slots, self.at, self.lengths

    def left(self, slot: int, x: torch.Tensor, frames: int) -> tuple:
        lefts, reads = self.at_step(self.history.lefts[slot], self.reads)
        return lefts, reads, self.at_step(self.history.lefts[slot], self.keeps)[1], self.lengths
