"""How the llm and the vocoder share one GPU: the llm's decode steps and the vocoder's steady flow calls,
each alone and both at once, arranged four ways:

- mps: two processes, clients of one CUDA MPS daemon, as `moss-serve up` runs them: the llm's share capped at
  --mps-llm-threads (the stack's 25%), and uncapped (100);
- one process (one CUDA context), each loop on a thread and a CUDA stream of its own: both streams at the same
  priority, the llm's at high priority, or the vocoder's at high priority.

MPS arms can also cap the vocoder (--mps-vocoder-threads), put each process on a green context of its own
multiprocessors (--green-llm-sms: the llm on that many, the vocoder on the rest; bench/studies/green_context.py), and put a
stand-in in the llm's place that keeps one property of its step (--neighbors: bench/studies/gpu_neighbors.py). Each child
checks its bf16 products (some MPS shares make cuBLAS wrong) and each phase records the SM clock and power.

Why: beside the vocoder under MPS the llm's step takes 12-16 ms against 6.4 alone, and each of the two runs 2-3x
slower beside the other than alone; in one context no share is fixed, and a stream's priority puts its kernels'
blocks ahead of the other's as multiprocessors free up.

    python bench/studies/gpu_sharing.py --json out.json                         # real size: one H100/H200, ~4 minutes
    python bench/studies/gpu_sharing.py --quantization fp8 --no-one-process     # the llm's products in FP8, under MPS only
    python bench/studies/gpu_sharing.py --size tiny --device cpu --seconds 1 --kv-gb 0.05 --batch 4 --windows 2   # a smoke run (no MPS)
    python bench/studies/gpu_sharing.py --no-one-process --mps-llm-threads 25 --neighbors llm,read,read-evict-first,spin
                                                # what in the llm's step slows the vocoder (bench/studies/gpu_neighbors.py)
    python bench/studies/gpu_sharing.py --no-one-process --mps-llm-threads 100 --green-llm-sms 32 --neighbors llm,spin,read
                                                # the same with the two on separate multiprocessors

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

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch
from gpu_loops import LlmLoop, VocoderLoop, neighbor_loop  # noqa: E402

ARMS_ONE_PROCESS = ("same priority", "llm high", "vocoder high")
NEIGHBORS = ("llm", "llm-triton", "llm-triton-evict-first", "read", "read-evict-first", "spin")  # gpu_neighbors.py


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


def products_checked(device: torch.device) -> str:
    """Whether cuBLAS's bf16 products are right in this process (under MPS some shares make them wrong:
    services/common/matmul_check.py): "right", or the fault's message."""
    if device.type != "cuda":
        return "not checked (cpu)"
    from services.common.matmul_check import MatmulFault, check_matmul

    try:
        check_matmul(device)
        return "right"
    except MatmulFault as fault:
        return str(fault)


def child(args) -> None:
    """Build the loops this role needs, then answer commands from stdin, one JSON line each on stdout."""
    sys.setswitchinterval(0.0005)  # two Python threads launching work: hand the GIL over often
    device = torch.device(args.device)
    sms = None
    if args.green:  # before PyTorch touches the GPU: this thread's context is the green one from here on
        import gpu_neighbors
        from green_context import make_current

        part, num_sms = args.green.split(":")
        make_current(int(num_sms), part)
        sms = gpu_neighbors.sm_ids(device)
    if args.llm_pdl == "off" and args.role == "llm":  # (its graphs are captured with plain launches)
        from services.common import launch

        launch.ENABLED = False
    llm = neighbor_loop(args, device) if args.role in ("llm", "both") else None
    vocoder = VocoderLoop(args.size, device, args.windows, args.flow_variant) if args.role in ("vocoder", "both") else None
    loops = {"llm": llm, "vocoder": vocoder}
    print(json.dumps({"ready": args.role, "products": products_checked(device), "sms": sms}), flush=True)
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
    def __init__(self, role: str, args, env: dict | None = None, neighbor: str = "llm", green: str = ""):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--role", role, "--size", args.size, "--device",
               args.device, "--batch", str(args.batch), "--context", str(args.context), "--windows", str(args.windows),
               "--seconds", str(args.seconds), "--kv-gb", str(args.kv_gb), "--quantization", args.quantization,
               "--neighbor", neighbor, "--flow-variant", args.flow_variant, "--llm-pdl", args.llm_pdl] + (
               ["--green", green] if green else [])
        self.role = role
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        ready = self.read()  # {"ready": role, "products": ..., "sms": the multiprocessors it runs on, if green}
        self.products, self.sms = ready["products"], ready["sms"]
        if self.products != "right":
            print(f"  [{role}] PRODUCTS WRONG: {self.products}", flush=True)

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


class Clocks:
    """The GPU's SM clock and power while a phase runs (nvidia-smi every 100 ms): is a loop slower beside the other
    because the GPU clocks down? → mean SM MHz and watts, in `.reading`."""

    QUERY = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "100"]

    def __enter__(self):
        self.proc = subprocess.Popen(self.QUERY, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        text = self.proc.communicate(timeout=10)[0]
        samples = [[float(v) for v in line.split(",")] for line in text.splitlines() if line.count(",") == 1]
        samples = samples[2:-2] or samples  # leave out the phase's edges
        self.reading = ({"sm_mhz": round(sum(s[0] for s in samples) / len(samples)),
                         "watts": round(sum(s[1] for s in samples) / len(samples))} if samples else {})


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
        for vocoder_share in out["mps_vocoder_threads"]:
            # one vocoder for every arm at its share; 100: uncapped, as the stack runs it
            vocoder = Child("vocoder", args, {**mps.env(), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(vocoder_share)},
                            green=f"rest:{args.green_llm_sms}" if args.green_llm_sms else "")
            try:
                vocoder_arms(args, out, mps, vocoder, vocoder_share)
            finally:
                vocoder.close()


def vocoder_arms(args, out: dict, mps, vocoder: Child, vocoder_share: int) -> None:
    """Each llm share and neighbor beside this vocoder: each alone, then both at once."""
    for share in out["mps_llm_threads"]:
        for neighbor in out["neighbors"]:
            arm = mps_arm(share, neighbor, vocoder_share)
            llm = Child("llm", args, {**mps.env(), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(share)}, neighbor,
                        green=f"first:{args.green_llm_sms}" if args.green_llm_sms else "")
            out["products"][arm] = {"llm": llm.products, "vocoder": vocoder.products}
            if args.green_llm_sms:  # (under MPS %smid counts within a context: how many, not which)
                out["sms"][arm] = {"llm": len(llm.sms), "vocoder": len(vocoder.sms)}
                log(f"{arm}: green contexts, the llm's kernels on {len(llm.sms)} multiprocessors, the vocoder's on "
                    f"{len(vocoder.sms)}")
            try:
                clocks = out["clocks"][arm] = {}
                for loop, c in (("llm", llm), ("vocoder", vocoder)):
                    with Clocks() as k:
                        out["arms"][f"{arm}: {loop}"] = c.ask(loop)
                    clocks[loop] = k.reading
                for c in (llm, vocoder):
                    c.send("ready")
                for c in (llm, vocoder):
                    c.read()  # {"prepared": ...}
                with Clocks() as k:
                    for c in (llm, vocoder):
                        c.send("go")
                    both = [llm.read()["results"][0], vocoder.read()["results"][0]]
                clocks["both"] = k.reading
                out["arms"][f"{arm}: both"] = both
                log(f"{arm}: {out['arms'][f'{arm}: llm']} {out['arms'][f'{arm}: vocoder']} {both}; clocks {clocks}")
            finally:
                llm.close()


def mps_arm(share: int, neighbor: str, vocoder_share: int = 100) -> str:
    """An MPS arm's name: the stack's arrangement keeps the names of the runs before --neighbors."""
    name = f"mps {share}%" if neighbor == "llm" else f"mps {share}% {neighbor}"
    return name if vocoder_share == 100 else f"{name}, vocoder {vocoder_share}%"


def table(out: dict) -> str:
    arms = out["arms"]
    rows = ["| arrangement | llm step alone | vocoder call alone | llm step beside | vocoder call beside | llm speed "
            "beside / alone | vocoder's | sum |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    groups = [(f"mps, {n} at {s}%" + ("" if v == 100 else f", vocoder at {v}%"), f"{mps_arm(s, n, v)}: llm",
               f"{mps_arm(s, n, v)}: vocoder", f"{mps_arm(s, n, v)}: both")
              for v in out["mps_vocoder_threads"] for s in out["mps_llm_threads"] for n in out["neighbors"]]
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
    if out.get("clocks"):
        rows += ["", "| MPS arm | SM MHz, watts: llm alone | vocoder alone | both |", "| --- | --- | --- | --- |"]
        for arm, c in out["clocks"].items():
            cells = [f"{c[k].get('sm_mhz', '-')} MHz, {c[k].get('watts', '-')} W" if k in c else "-"
                     for k in ("llm", "vocoder", "both")]
            rows.append(f"| {arm} | " + " | ".join(cells) + " |")
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
    p.add_argument("--mps-vocoder-threads", default="100", help="MPS arms: the vocoder's shares (100: uncapped)")
    p.add_argument("--neighbors", default="llm",
                   help="MPS arms: what runs at the llm's share beside the vocoder (bench/studies/gpu_neighbors.py)")
    p.add_argument("--green-llm-sms", type=int, default=0,
                   help="MPS arms: the llm on a green context of this many multiprocessors, the vocoder on one of the "
                        "rest (bench/studies/green_context.py; 0: none)")
    p.add_argument("--neighbor", default="llm", help=argparse.SUPPRESS)
    p.add_argument("--green", default="", help=argparse.SUPPRESS)
    p.add_argument("--flow-variant", default="defaults", help="the vocoder's flow kernels: a codec_flow_profile variant")
    p.add_argument("--llm-pdl", choices=["on", "off"], default="on",
                   help="the llm's Triton kernels launched while the one before runs (services/common/launch.py); MPS arms")
    p.add_argument("--json")
    p.add_argument("--role", choices=["llm", "vocoder", "both"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role:
        return child(args)
    shares = [int(s) for s in args.mps_llm_threads.split(",") if s.strip()]
    if args.device != "cuda":
        shares = []
    neighbors = [n for n in args.neighbors.split(",") if n]
    if unknown := set(neighbors) - set(NEIGHBORS):
        p.error(f"--neighbors: unknown {sorted(unknown)}; choose from {', '.join(NEIGHBORS)}")
    from codec_flow_profile import VARIANTS
    if args.flow_variant not in VARIANTS:
        p.error(f"--flow-variant: unknown {args.flow_variant!r}; choose from {', '.join(VARIANTS)}")
    out = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "mps_llm_threads": shares,
           "neighbors": neighbors, "products": {}, "sms": {}, "clocks": {},
           "mps_vocoder_threads": [int(s) for s in args.mps_vocoder_threads.split(",") if s.strip()],
           "settings": {k: v for k, v in vars(args).items() if k != "role"}, "arms": {}}
    if args.device == "cuda":
        out["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True).stdout.strip()
    if not args.no_one_process:
        one_process(args, out)
    if shares:
        mps_arms(args, out)
    print(f"\n{out.get('gpu', 'cpu')}, {out['date']}: llm {args.batch} x {args.context} decoding (bf16, graphs, "
          f"quantization {args.quantization}, PDL {args.llm_pdl}), vocoder flow calls of {args.windows} windows ({args.flow_variant}); "
          f"{args.seconds:.0f} s a loop"
          + (f"; MPS arms on green contexts, the llm's of {args.green_llm_sms} multiprocessors, the vocoder's of the rest"
             if args.green_llm_sms else ""))
    print(table(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
