"""The fast step runner: fused kernels over the paged pool, CUDA graphs for every step that fits one.

Two kinds of step, each run from static buffers padded to a bucket and, on CUDA, replayed from one
captured graph per bucket (embedding → 40 layers; launching the ~400 kernels of a forward one by one
costs the host ~20 ms, more than the GPU needs for a 512-token prefill):
- decode (every scheduled sequence computes exactly its last position): buckets of sequences
  (1, 2, 4, ..., max_num_seqs), split-K decode attention, final norms inside the graph;
- packed (prefill chunks, prefix hits, mixed prefill + decode): buckets of rows (16, 32, 64, ...,
  up to PACKED_GRAPH_ROWS), the sequence axis padded to max_num_seqs, varlen prefill attention whose
  grid depends only on those two sizes. Larger packed steps run eagerly: their GEMMs outlast the launches.
Padding rows have slot -1 (no K/V stored) and context 0; padding sequences have no rows. The heads run
after the trunk, only for the rows whose mode samples them (runner contract in torch_runner.py).

Host work per step is list building and two or three pinned copies; the only device → host read of the
step is the sampler's.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from services.common.cuda_graph import capture
from services.common.tensors import Uploader
from services.llm.batch import ScheduledBatch
from services.llm.model.model import MossSpeechForCausalLM
from services.llm.runner.forward import PackedForward, StepTensors
from services.llm.runner.ops import make_ops
from services.llm.sequence import Mode, Sequence

DECODE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PACKED_BUCKETS = (16, 32, 64, 128, 192, 256, 384, 512, 768, 1024)
PACKED_GRAPH_ROWS = PACKED_BUCKETS[-1]  # above this, a packed step's GEMMs take longer than its eager launches


def decode_buckets(max_num_seqs: int) -> list[int]:
    return sorted({b for b in DECODE_BUCKETS if b < max_num_seqs} | {max_num_seqs})


def packed_buckets(max_num_batched_tokens: int) -> list[int]:
    top = min(max_num_batched_tokens, PACKED_GRAPH_ROWS)
    return sorted({b for b in PACKED_BUCKETS if b < top} | {top})


class BlockTableMirror:
    """Each running sequence's block table as a row of a host array [slots, max_blocks] int32, kept by
    appending new entries (a decoding sequence gains one block every block_size steps) instead of
    rebuilding B rows each step. A row is rewritten whole when its sequence's table list is a new
    object (admission, preemption and readmission)."""

    def __init__(self, slots: int, max_blocks: int):
        self.table = np.zeros((slots, max_blocks), dtype=np.int32)
        self.known = [0] * slots
        self.owner: list[list | None] = [None] * slots

    def rows(self, seqs: list[Sequence]) -> np.ndarray:
        slots = []
        for seq in seqs:
            slot, table = seq.slot, seq.block_table
            if self.owner[slot] is not table:
                self.owner[slot], self.known[slot] = table, 0
            if len(table) > self.known[slot]:
                self.table[slot, self.known[slot] : len(table)] = table[self.known[slot] :]
                self.known[slot] = len(table)
            slots.append(slot)
        return self.table[slots]


class KernelRunner:
    def __init__(self, model: MossSpeechForCausalLM, num_blocks: int, block_size: int, device: torch.device,
                 max_num_seqs: int, max_model_len: int, kernels: str = "auto", cuda_graphs: bool = True,
                 upload: Uploader | None = None, max_num_batched_tokens: int = 512, text_skip: bool = True,
                 quantization: str = "none"):
        cfg = model.cfg
        self.upload = upload or Uploader(device)
        self.cfg, self.model, self.device, self.block_size = cfg, model, device, block_size
        dtype = next(model.parameters()).dtype
        self.kv_cache = torch.zeros(num_blocks, cfg.num_layers, 2, cfg.num_key_value_heads, block_size, cfg.head_dim,
                                    dtype=dtype, device=device)
        if kernels == "auto":
            kernels = "triton" if device.type == "cuda" else "torch"
        self.text_skip = text_skip
        trunk = torch.zeros(num_blocks * block_size + 1, cfg.hidden_size, dtype=dtype, device=device) if text_skip else None
        self.forward = PackedForward(model, self.kv_cache, make_ops(kernels, cfg, max_model_len, device), trunk,
                                     quantization)
        self.skipped_steps = 0      # steps that left the text branch out
        self.filled_positions = 0   # text-branch positions computed later, in fills
        self.max_blocks = -(-max_model_len // block_size)
        self.tables = BlockTableMirror(max_num_seqs, self.max_blocks)
        self.max_num_seqs = max_num_seqs
        self.buckets = decode_buckets(max_num_seqs)
        self.static = self._static_inputs(self.buckets[-1], self.buckets[-1])
        self.graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, tuple]] = {}  # by (bucket, with text branch)
        self.packed_buckets = packed_buckets(max_num_batched_tokens)
        self.packed = self._static_inputs(self.packed_buckets[-1], max_num_seqs, packed=True)
        self.packed_graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, tuple]] = {}  # by (bucket, with text branch)
        # (decode graphs, packed graphs) by the place they run: "whole" (the process's context), or another place's
        # (a green context's: services/llm/engine/gpu_share.py); `use` picks the set steps replay
        self.graph_sets: dict[str, tuple[dict, dict]] = {}
        self.capturable = cuda_graphs and device.type == "cuda" and kernels == "triton"  # the torch ops sync
        if self.capturable:
            self.capture()

    # ---- static buffers and graphs ------------------------------------------------------------------
    def _static_inputs(self, rows: int, seqs: int, packed: bool = False) -> StepTensors:
        """Zeroed step inputs: every row a padding row (slot -1), every sequence a padding one (context 0,
        and in a packed step no rows: cu_seqlens_q all 0), so a capture writes nothing to the pool."""
        z = lambda dtype, *shape: torch.zeros(*shape, dtype=dtype, device=self.device)  # noqa: E731
        return StepTensors(z(torch.long, rows), z(torch.long, rows), z(torch.long, rows),
                           torch.full((rows,), -1, dtype=torch.long, device=self.device),
                           z(torch.int32, seqs, self.max_blocks), z(torch.int32, seqs),
                           z(torch.int32, seqs + 1) if packed else None)

    def _bucket_view(self, bucket: int) -> StepTensors:
        s = self.static
        return StepTensors(s.text_ids[:bucket], s.audio_ids[:bucket], s.positions[:bucket], s.slot_mapping[:bucket],
                           s.block_tables[:bucket], s.context_lens[:bucket])

    def _packed_view(self, bucket: int) -> StepTensors:
        """The first `bucket` rows; the sequence axis stays whole (max_num_seqs)."""
        s = self.packed
        return StepTensors(s.text_ids[:bucket], s.audio_ids[:bucket], s.positions[:bucket], s.slot_mapping[:bucket],
                           s.block_tables, s.context_lens, s.cu_seqlens_q)

    def _decode_forward(self, t: StepTensors, with_text: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Trunk, branches and final norms for every row → (text hidden or None, audio hidden) [bucket, hidden]."""
        text, audio = self.forward(t, text=with_text)
        m = self.model.model
        text_h = self.forward.final_hidden(text, m.text_norm.weight) if with_text else None
        return text_h, self.forward.final_hidden(audio, m.audio_norm.weight)

    @torch.inference_mode()
    def capture(self, place: str = "whole", stream: torch.cuda.Stream | None = None) -> None:
        """One graph per bucket, largest first so that smaller ones reuse its memory pool (one pool for
        all: a step replays one graph and consumes its outputs before the next replay), into the set of
        `place`, captured on `stream` (that place's; the caller makes its context current). The static
        buffers hold padding while capturing (before any step): nothing is written to the pool."""
        pool = None
        graphs, packed_graphs = {}, {}

        def record(fn, t):
            nonlocal pool
            graph, out = capture(lambda: fn(t), self.device, pool, stream=stream)
            pool = graph.pool()
            return graph, out

        branches = (True, False) if self.text_skip else (True,)
        for bucket in reversed(self.packed_buckets):
            for with_text in branches:
                packed_graphs[bucket, with_text] = record(lambda t: self.forward(t, text=with_text),
                                                          self._packed_view(bucket))
        for bucket in reversed(self.buckets):
            for with_text in branches:
                graphs[bucket, with_text] = record(lambda t: self._decode_forward(t, with_text), self._bucket_view(bucket))
        torch.cuda.synchronize()
        torch.cuda.current_stream().synchronize()  # (a green context's stream: the device's synchronize is not its)
        self.graph_sets[place] = graphs, packed_graphs
        if place == "whole":
            self.use("whole")

    def use(self, place: str) -> None:
        """Steps replay the graphs captured for `place` (the caller runs them on its stream) from here on."""
        self.graphs, self.packed_graphs = self.graph_sets[place]

    def _run_decode(self, seqs: list[Sequence], feed: tuple[torch.Tensor, torch.Tensor] | None = None,
                    with_text: bool = True):
        n = len(seqs)
        bucket = next(b for b in self.buckets if b >= n)
        bs, pad = self.block_size, bucket - n
        pos = [seq.num_cached for seq in seqs]
        ids = ([0] * n, [0] * n) if feed is not None else ([seq.text_ids[p] for seq, p in zip(seqs, pos)],
                                                           [seq.audio_ids[p] for seq, p in zip(seqs, pos)])
        ints = torch.tensor([
            ids[0] + [0] * pad,
            ids[1] + [0] * pad,
            pos + [0] * pad,
            [seq.block_table[p // bs] * bs + p % bs for seq, p in zip(seqs, pos)] + [-1] * pad,
        ], dtype=torch.long)
        tables = np.zeros((bucket, self.max_blocks + 1), dtype=np.int32)  # last column: context length
        tables[:n, :-1] = self.tables.rows(seqs)
        tables[:n, -1] = [p + 1 for p in pos]
        ints, tables = self.upload(ints), self.upload(torch.from_numpy(tables))
        t = self._bucket_view(bucket)
        for dst, src in zip((t.text_ids, t.audio_ids, t.positions, t.slot_mapping), ints):
            dst.copy_(src, non_blocking=True)
        t.block_tables.copy_(tables[:, :-1], non_blocking=True)
        t.context_lens.copy_(tables[:, -1], non_blocking=True)
        if feed is not None:  # this step's input ids are the previous step's samples, still on the device
            t.text_ids[:n].copy_(feed[0])
            t.audio_ids[:n].copy_(feed[1])
        if (bucket, with_text) in self.graphs:
            graph, out = self.graphs[bucket, with_text]
            graph.replay()
            return out
        return self._decode_forward(t, with_text)

    # ---- prefill and mixed steps -------------------------------------------------------------------
    def _run_packed(self, batch: ScheduledBatch, text_rows: list[int], audio_rows: list[int], with_text: bool = True):
        bs = self.block_size
        text, audio, positions, slots, cu, ctx = [], [], [], [], [0], []
        for seq, n in zip(batch.seqs, batch.num_tokens):
            start = seq.num_cached
            text += seq.text_ids[start : start + n]
            audio += seq.audio_ids[start : start + n]
            positions += range(start, start + n)
            slots += [seq.block_table[p // bs] * bs + p % bs for p in range(start, start + n)]
            cu.append(cu[-1] + n)
            ctx.append(start + n)
        rows, num_seqs = cu[-1], len(batch.seqs)
        bucket = next((b for b in self.packed_buckets if b >= rows), None)
        if bucket is None:  # eager, unpadded
            ints = self.upload(torch.tensor([text, audio, positions, slots], dtype=torch.long))
            meta = self.upload(torch.tensor(cu + ctx, dtype=torch.int32))
            tables = self.upload(torch.from_numpy(self.tables.rows(batch.seqs)))
            t = StepTensors(ints[0], ints[1], ints[2], ints[3], tables, meta[num_seqs + 1 :], meta[: num_seqs + 1])
            streams = self.forward(t, text=with_text)
        else:  # padded to (bucket rows, max_num_seqs sequences) in the static buffers; a graph on CUDA
            pad, seq_pad = bucket - rows, self.max_num_seqs - num_seqs
            ints = self.upload(torch.tensor([text + [0] * pad, audio + [0] * pad, positions + [0] * pad,
                                             slots + [-1] * pad], dtype=torch.long))
            meta = np.zeros((self.max_num_seqs, self.max_blocks + 1), dtype=np.int32)  # last column: context
            meta[:num_seqs, :-1] = self.tables.rows(batch.seqs)
            meta[:num_seqs, -1] = ctx
            meta = self.upload(torch.from_numpy(meta))
            cu_dev = self.upload(torch.tensor(cu + [rows] * seq_pad, dtype=torch.int32))
            t = self._packed_view(bucket)
            for dst, src in zip((t.text_ids, t.audio_ids, t.positions, t.slot_mapping), ints):
                dst.copy_(src, non_blocking=True)
            t.block_tables.copy_(meta[:, :-1], non_blocking=True)
            t.context_lens.copy_(meta[:, -1], non_blocking=True)
            t.cu_seqlens_q.copy_(cu_dev, non_blocking=True)
            if (bucket, with_text) in self.packed_graphs:
                graph, streams = self.packed_graphs[bucket, with_text]
                graph.replay()
            else:
                streams = self.forward(t, text=with_text)
        text_stream, audio_stream = streams
        m = self.model.model
        text_h = self.forward.final_hidden(text_stream, m.text_norm.weight, self._rows(text_rows)) if text_rows else None
        audio_h = self.forward.final_hidden(audio_stream, m.audio_norm.weight, self._rows(audio_rows)) if audio_rows else None
        return text_h, audio_h

    # ---- the text branch, skipped while speaking and filled in later -------------------------------
    def _fill_text_branch(self, seqs: list[Sequence]) -> None:
        """Compute the text branch over each sequence's positions [text_kv_upto, num_cached), in one
        packed pass from the kept trunk outputs, so that its text K/V are complete again (eager: once per
        switch back to text, not per step)."""
        bs = self.block_size
        positions, slots, cu, ctx = [], [], [0], []
        for seq in seqs:
            span = range(seq.text_kv_upto, seq.num_cached)
            positions += span
            slots += [seq.block_table[p // bs] * bs + p % bs for p in span]
            cu.append(cu[-1] + len(span))
            ctx.append(seq.num_cached)
        ints = self.upload(torch.tensor([positions, slots], dtype=torch.long))
        meta = self.upload(torch.tensor(cu + ctx, dtype=torch.int32))
        tables = self.upload(torch.from_numpy(self.tables.rows(seqs)))
        s = len(seqs)
        self.forward.text_branch(StepTensors(None, None, ints[0], ints[1], tables, meta[s + 1 :], meta[: s + 1]))
        for seq in seqs:
            seq.text_kv_upto = seq.num_cached
        self.filled_positions += cu[-1]

    # ---- the runner contract -----------------------------------------------------------------------
    @torch.inference_mode()
    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy each (source, destination) block: its K/V in every layer and the trunk outputs kept for its positions
        (torch_runner.py's contract), on the step's stream ahead of the step."""
        bs = self.block_size
        ids = self.upload(torch.tensor(copies, dtype=torch.long).T.contiguous())    # [2, copies]
        self.kv_cache[ids[1]] = self.kv_cache[ids[0]]
        trunk = self.forward.trunk
        if trunk is not None:
            offsets = torch.arange(bs, device=ids.device)
            rows = (ids[:, :, None] * bs + offsets).flatten(1)                        # [2, copies * block_size]
            trunk[rows[1]] = trunk[rows[0]]

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch, feed: tuple[torch.Tensor, torch.Tensor] | None = None
            ) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """Compute the scheduled positions (every sequence holds a sampler slot); → (indices into
        batch.seqs of the sequences that sample, text logits [T, V] of those in text mode, audio logits
        [A, V_audio] of those in audio mode, in batch order).

        feed: (text ids [B], audio ids [B]) on the device for a decode step launched ahead: each
        sequence computes position num_cached == len(seq), whose tokens the host does not have yet."""
        sampled, text_rows, audio_rows = [], [], []
        row = 0
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_tokens)):
            row += n
            if seq.num_cached + n == len(seq) or feed is not None:
                sampled.append(i)
                (text_rows if seq.mode is Mode.TEXT else audio_rows).append(row - 1)
        decode = all(n == 1 for n in batch.num_tokens) and len(sampled) == len(batch.seqs)
        # A step in which no sequence samples text (every one speaks, or is partway through its prompt) leaves the
        # text branch out: decode steps while speaking, and a spoken turn's prefill (its prompt ends with sosp) with
        # the mixed step it rides in. Those positions' text K/V are filled in from the kept trunk outputs before
        # their sequence next samples text; otherwise both branches run.
        with_text = not (self.text_skip and not text_rows)
        gaps = [batch.seqs[i] for i in sampled if batch.seqs[i].mode is Mode.TEXT
                and batch.seqs[i].text_kv_upto < batch.seqs[i].num_cached]
        if gaps:
            self._fill_text_branch(gaps)
        if decode:
            text_h, audio_h = self._run_decode(batch.seqs, feed, with_text)
            text_h = text_h[self._rows(text_rows)] if text_rows else None
            audio_h = audio_h[self._rows(audio_rows)] if audio_rows else None
        else:
            text_h, audio_h = self._run_packed(batch, text_rows, audio_rows, with_text)
        self.skipped_steps += not with_text
        for seq, n in zip(batch.seqs, batch.num_tokens):
            seq.record_text_kv(seq.num_cached, n, with_text)
            seq.num_cached += n
        return sampled, self._head(self.model.text_lm_head.weight, text_h), self._head(self.model.audio_lm_head.weight, audio_h)

    def _rows(self, rows: list[int]) -> torch.Tensor | slice:
        """Row indices on the device (a slice when they are 0..n-1: no copy, no gather)."""
        if rows == list(range(len(rows))):
            return slice(0, len(rows))
        return self.upload(torch.tensor(rows, dtype=torch.long))

    def _head(self, weight: torch.Tensor, hidden: torch.Tensor | None) -> torch.Tensor:
        if hidden is None:
            return torch.zeros(0, weight.shape[0], device=self.device)
        return F.linear(hidden, weight).float()
