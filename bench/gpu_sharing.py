"""How the llm and the vocoder share one GPU (issue 23): the llm's decode steps and the vocoder's steady flow calls,
each alone and both at once, arranged four ways:

- mps: two processes, clients of one CUDA MPS daemon, as `moss-serve up` runs them: the llm's share capped at
  --mps-llm-threads (the stack's 25%), and uncapped (100);
- one process (one CUDA context), each loop on a thread and a CUDA stream of its own: both streams at the same
  priority, the llm's at high priority, or the vocoder's at high priority.

Why: beside the vocoder under MPS the llm's step takes 12-16 ms against 6.4 alone, and each of the two runs 2-3x
slower beside the other than alone; in one context no share is fixed, and a stream's priority puts its kernels'
blocks ahead of the other's as multiprocessors free up.

    python bench/gpu_sharing.py --json out.json                         # real size: one H100/H200, ~4 minutes
    python bench/gpu_sharing.py --quantization fp8 --no-one-process     # the llm's products in FP8, under MPS only
    python bench/gpu_sharing.py --size tiny --device cpu --seconds 1    # a smoke run of the machinery (no MPS)

The llm: --batch sequences of --context positions, all decoding, steps back to back (LLMEngine.step(), bf16, its
CUDA graphs). The vocoder: steady flow calls of --windows streams' 20-token windows (codec FlowTokenDecoder with
each stream's history, its CUDA graphs), one after another, each waited for as the vocoder's worker does. Each
loop runs --seconds; side by side, both start together. Prints a table (ms a step or a call, and each loop's speed
beside the other as a share of its speed alone: the two shares' sum is the GPU work done against doing the two one
after the other) and writes JSON. Every arm runs in a child process; the parent touches no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: measure.py, llm_engine.py, codec_flow_profile.py
from measure import sync  # noqa: E402

ARMS_ONE_PROCESS = ("same priority", "llm high", "vocoder high")


# ---- the two loops (run inside a child) ----------------------------------------------------------------------

class LlmLoop:
    """B sequences decoding, stepped back to back."""

    def __init__(self, size: str, device: torch.device, batch: int, context: int, kv_gb: float,
                 quantization: str = "none"):
        from llm_engine import Prompts

        from services.llm.engine.engine import EngineConfig, LLMEngine
        from services.llm.model.checkpoint import random_model
        from services.llm.model.config import preset
        from services.llm.model.tokenizer import tiny_tokenizer

        cfg = preset("moss-speech" if size == "real" else "tiny")
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        model = random_model(cfg, device=device, dtype=dtype)
        config = EngineConfig(kv_cache_bytes=int(kv_gb * (1 << 30)), max_num_seqs=batch, max_num_batched_tokens=2048,
                              max_model_len=8192, quantization=quantization)
        self.engine = LLMEngine(model, tiny_tokenizer(preset("tiny")), config)
        self.batch, self.context, self.device = batch, context, device
        blocks = self.engine.block_manager.num_blocks
        # what the pool holds for each sequence, less its prompt and two blocks of margin
        self.new_tokens = min(blocks * config.block_size // batch, config.max_model_len) - context - 2 * config.block_size
        if self.new_tokens < 64:
            raise SystemExit(f"--kv-gb {kv_gb}: {blocks} blocks leave {self.new_tokens} tokens a sequence")
        self.prompts = Prompts(cfg)  # fresh random prompts: no prefix-cache hits

    def prepare(self) -> None:
        """Fresh sequences, stepped until all are decoding (their prefills are not timed)."""
        e = self.engine
        for seq_id in list(e.sequences):
            e.abort(seq_id)
        for _ in range(self.batch):
            e.add(e.make_sequence(self.prompts.request(self.context, self.new_tokens)))
        while e.scheduler.waiting or any(s.num_steps == 0 for s in e.scheduler.running):
            e.step()
        for _ in range(3):
            e.step()
        sync(self.device)

    def run(self, seconds: float) -> dict:
        e, steps = self.engine, 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds and steps < self.new_tokens - 8:
            e.step()
            if e.last_step.decode_tokens != self.batch or e.last_step.prefill_tokens:
                raise RuntimeError(f"step {steps} was not a pure decode step of {self.batch}: {e.last_step}")
            steps += 1
        sync(self.device)
        wall = time.perf_counter() - start
        return {"loop": "llm", "steps": steps, "seconds": wall, "ms": wall / steps * 1e3}


class VocoderLoop:
    """Steady flow calls of W streams' 20-token windows, each waited for."""

    def __init__(self, size: str, device: torch.device, windows: int):
        from codec_flow_profile import CHUNK, WARM_CHUNKS, steady_rows

        from services.vocoder.codec.checkpoint import random_codec
        from services.vocoder.codec.config import moss_speech, tiny
        from services.vocoder.codec.decoder import FlowTokenDecoder
        from services.vocoder.codec.voice import random_voice

        cfg = moss_speech() if size == "real" else tiny()
        voice = random_voice(cfg.flow, prompt_tokens=40, seed=3)
        g = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, cfg.flow.vocab_size, (windows, sum(WARM_CHUNKS) + CHUNK), generator=g).tolist()
        self.decoder = FlowTokenDecoder(random_codec(cfg, 0)[0], device, history_streams=windows)
        self.decoder.set_voices([voice])
        with torch.inference_mode():
            self.rows = steady_rows(self.decoder, voice, tokens)
        self.windows, self.device = windows, device

    def prepare(self) -> None:
        with torch.inference_mode():
            self.decoder.decode_chunks(self.rows)  # its graph, captured on the first call
        sync(self.device)

    def run(self, seconds: float) -> dict:
        calls, stream = 0, torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        start = time.perf_counter()
        with torch.inference_mode():
            while time.perf_counter() - start < seconds:
                self.decoder.decode_chunks(self.rows)
                if stream is not None:
                    stream.synchronize()  # the worker reads each call's audio back before the next
                calls += 1
        wall = time.perf_counter() - start
        return {"loop": "vocoder", "calls": calls, "seconds": wall, "ms": wall / calls * 1e3}


def stream_for(device: torch.device, priority: int):
    """A CUDA stream of the given priority (-1 high, 0 normal), or a null context on the CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.Stream(device, priority=priority)


def run_on(loop, seconds: float, stream, out: list, barrier: threading.Barrier | None = None) -> None:
    with torch.inference_mode():
        if stream is None:
            if barrier:
                barrier.wait()
            out.append(loop.run(seconds))
            return
        with torch.cuda.stream(stream):  # (a thread's current stream is its own)
            if barrier:
                barrier.wait()
            out.append(loop.run(seconds))


def side_by_side(llm: LlmLoop, vocoder: VocoderLoop, seconds: float, llm_priority: int, vocoder_priority: int,
                 device: torch.device) -> list[dict]:
    llm.prepare()
    vocoder.prepare()
    out: list[dict] = []
    barrier = threading.Barrier(2)
    threads = [threading.Thread(target=run_on, args=(llm, seconds, stream_for(device, llm_priority), out, barrier)),
               threading.Thread(target=run_on, args=(vocoder, seconds, stream_for(device, vocoder_priority), out,
                                                      barrier))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(out, key=lambda r: r["loop"])


def child(args) -> None:
    """Build the loops this role needs, then answer commands from stdin, one JSON line each on stdout."""
    sys.setswitchinterval(0.0005)  # two Python threads launching work: hand the GIL over often
    device = torch.device(args.device)
    llm = (LlmLoop(args.size, device, args.batch, args.context, args.kv_gb, args.quantization)
           if args.role in ("llm", "both") else None)
    vocoder = VocoderLoop(args.size, device, args.windows) if args.role in ("vocoder", "both") else None
    loops = {"llm": llm, "vocoder": vocoder}
    print(json.dumps({"ready": args.role}), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            break
        if command in loops:  # one loop, on its own stream at normal priority
            loops[command].prepare()
            out = []
            run_on(loops[command], args.seconds, stream_for(device, 0), out)
            result = out
        elif command == "ready":  # MPS arms: prepare, then wait for "go" so that both children start together
            loops[args.role].prepare()
            print(json.dumps({"prepared": args.role}), flush=True)
            assert sys.stdin.readline().strip() == "go"
            out = []
            run_on(loops[args.role], args.seconds, stream_for(device, 0), out)
            result = out
        else:
            llm_priority, vocoder_priority = {"same priority": (0, 0), "llm high": (-1, 0),
                                              "vocoder high": (0, -1)}[command]
            result = side_by_side(llm, vocoder, args.seconds, llm_priority, vocoder_priority, device)
        print(json.dumps({"arm": command, "results": result}), flush=True)


# ---- the parent: children, MPS, the table ---------------------------------------------------------------------

class Child:
    def __init__(self, role: str, args, env: dict | None = None):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--role", role, "--size", args.size, "--device",
               args.device, "--batch", str(args.batch), "--context", str(args.context), "--windows", str(args.windows),
               "--seconds", str(args.seconds), "--kv-gb", str(args.kv_gb), "--quantization", args.quantization]
        self.role = role
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.read()  # {"ready": role}

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the {self.role} child exited (code {self.proc.wait()})")
            if line.startswith("{"):
                return json.loads(line)
            print(f"  [{self.role}] {line.rstrip()}", flush=True)

    def ask(self, command: str) -> list[dict]:
        self.send(command)
        return self.read()["results"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.send("quit")
            self.proc.wait(60)


def one_process(args, out: dict) -> None:
    c = Child("both", args)
    try:
        for command in ("llm", "vocoder") + ARMS_ONE_PROCESS:
            out["arms"][f"one process: {command}"] = c.ask(command)
            log(f"one process, {command}: {out['arms'][f'one process: {command}']}")
    finally:
        c.close()


def mps_arms(args, out: dict) -> None:
    from services.mps import MpsDaemon

    with MpsDaemon() as mps:
        for share in out["mps_llm_threads"]:
            llm = Child("llm", args, {**mps.env(), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(share)})
            vocoder = Child("vocoder", args, mps.env())
            try:
                out["arms"][f"mps {share}%: llm"] = llm.ask("llm")
                out["arms"][f"mps {share}%: vocoder"] = vocoder.ask("vocoder")
                for c in (llm, vocoder):
                    c.send("ready")
                for c in (llm, vocoder):
                    c.read()  # {"prepared": ...}
                for c in (llm, vocoder):
                    c.send("go")
                both = [llm.read()["results"][0], vocoder.read()["results"][0]]
                out["arms"][f"mps {share}%: both"] = both
                log(f"mps {share}%: {out['arms'][f'mps {share}%: llm']} {out['arms'][f'mps {share}%: vocoder']} {both}")
            finally:
                llm.close()
                vocoder.close()


def table(out: dict) -> str:
    arms = out["arms"]
    rows = ["| arrangement | llm step alone | vocoder call alone | llm step beside | vocoder call beside | llm speed "
            "beside / alone | vocoder's | sum |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    groups = [(f"mps, llm at {s}%", f"mps {s}%: llm", f"mps {s}%: vocoder", f"mps {s}%: both")
              for s in out["mps_llm_threads"]]
    groups += [(f"one process, {a}", "one process: llm", "one process: vocoder", f"one process: {a}")
               for a in ARMS_ONE_PROCESS]
    for name, a_llm, a_voc, a_both in groups:
        if a_both not in arms:
            continue
        llm_alone, voc_alone = arms[a_llm][0]["ms"], arms[a_voc][0]["ms"]
        both = {r["loop"]: r["ms"] for r in arms[a_both]}
        s_llm, s_voc = llm_alone / both["llm"], voc_alone / both["vocoder"]
        rows.append(f"| {name} | {llm_alone:.2f} ms | {voc_alone:.1f} ms | {both['llm']:.2f} ms | "
                    f"{both['vocoder']:.1f} ms | {s_llm:.2f} | {s_voc:.2f} | {s_llm + s_voc:.2f} |")
    return "\n".join(rows)


def log(msg: str) -> None:
    print(msg, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=["real", "tiny"], default="real")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=128, help="llm sequences decoding")
    p.add_argument("--context", type=int, default=256, help="each sequence's prompt positions")
    p.add_argument("--kv-gb", type=float, default=24.0, help="the llm's KV pool (bounds each arm's steps)")
    p.add_argument("--windows", type=int, default=32, help="streams in each vocoder call")
    p.add_argument("--seconds", type=float, default=4.0, help="each loop's run")
    p.add_argument("--quantization", default="none", choices=["none", "fp8"], help="the llm's layer products")
    p.add_argument("--mps-llm-threads", default="25,100", help="MPS arms: the llm's shares (empty: no MPS arm)")
    p.add_argument("--no-one-process", action="store_true", help="leave out the one-process arms")
    p.add_argument("--json")
    p.add_argument("--role", choices=["llm", "vocoder", "both"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role:
        return child(args)
    shares = [int(s) for s in args.mps_llm_threads.split(",") if s.strip()]
    if args.device != "cuda":
        shares = []
    out = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "mps_llm_threads": shares,
           "settings": {k: v for k, v in vars(args).items() if k != "role"}, "arms": {}}
    if args.device == "cuda":
        out["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True).stdout.strip()
    if not args.no_one_process:
        one_process(args, out)
    if shares:
        mps_arms(args, out)
    print(f"\n{out.get('gpu', 'cpu')}, {out['date']}: llm {args.batch} x {args.context} decoding (bf16, graphs, "
          f"quantization {args.quantization}), vocoder flow calls of {args.windows} windows; {args.seconds:.0f} s a loop")
    print(table(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
