"""The llm's share of the GPU following the load: can one llm process run its steps on the whole GPU while the vocoder
is idle and on a quarter of the multiprocessors while it is busy, switching between steps?

Under MPS the llm runs at a share of 25% (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), fixed for the life of the process: it
keeps the llm's kernels from crowding out the vocoder's under load, and at one stream it costs the llm's decode step
~1.3x (6.4 against 4.9 ms) when there is nothing to leave room for. Here the llm process runs at 100% and, for its busy
steps, on a green context of the device's first N multiprocessors (services/common/green_context.py): its kernels
on N multiprocessors, its memory, modules and graphs the primary context's.

Arms, each a child process and a client of one MPS daemon (the llm's real size, random weights, bf16, its graphs):
- the llm at 25% (the stack today): decode steps at batch 1 and --batch;
- the llm at 100%: the same on the whole GPU; then on the green stream replaying the graphs captured on the whole GPU
  ("green replay": are they confined?); then graphs captured on the green stream ("green"); their outputs against the
  whole GPU's on the same inputs; steps alternating between the whole GPU and green, switching every step;
- beside the vocoder's steady flow calls (--windows streams), started together: the llm at 25%, and at 100% on green.

    python bench/studies/llm_share.py --json out.json        # real size, one H100/H200, ~4 minutes
    python bench/studies/llm_share.py --size tiny --seconds 1 --batch 4 --windows 2 --kv-gb 0.5   # a smoke run (a GPU)

Prints a table (ms a step or a call) and writes JSON. The parent touches no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import gpu_sharing
import torch
from gpu_loops import LlmLoop, VocoderLoop

from measure import sync

# ---- the llm child ----------------------------------------------------------------------------------------------

class Shares:
    """The llm loop with two sets of decode graphs: the whole GPU's (captured at start) and the green stream's."""

    def __init__(self, loop: LlmLoop, green_sms: int):
        self.loop, self.runner = loop, loop.engine.runner
        self.sets = {"whole": (self.runner.graphs, self.runner.packed_graphs)}
        self.green, self.green_sms = None, green_sms
        if green_sms:
            from services.common.green_context import GreenContext

            self.green = GreenContext(green_sms)

    def capture_green(self, carveout: bool = False, pdl: bool = True, name: str = "green") -> float:
        """Capture the runner's graphs again with the green context current, on its stream → seconds it took.
        carveout: cuBLAS told to use only the green context's multiprocessors (PyTorch's SM carveout: the device's
        count less the green context's); pdl: the llm's Triton kernels launched with PDL."""
        from services.common import cuda_graph, launch

        r, start = self.runner, time.perf_counter()
        self.pad_static()
        launch.ENABLED = pdl
        if carveout:
            torch._C._set_sm_carveout_experimental(self.carveout())
        r.graphs, r.packed_graphs = {}, {}
        saved = cuda_graph._capture_streams.get(0)
        with self.green.current():
            cuda_graph._capture_streams[0] = self.green.stream
            try:
                r.capture()
            finally:
                cuda_graph._capture_streams[0] = saved
                torch._C._set_sm_carveout_experimental(None)
                launch.ENABLED = True
        self.sets[name] = (r.graphs, r.packed_graphs)
        r.graphs, r.packed_graphs = self.sets["whole"]
        return time.perf_counter() - start

    def pad_static(self) -> None:
        """The runner's static step buffers back to padding, as its capture expects (a step left real rows in them:
        captured so, a packed graph would read a prefill's rows that are not there)."""
        for t in (self.runner.static, self.runner.packed):
            for name in ("text_ids", "audio_ids", "positions", "block_tables", "context_lens", "cu_seqlens_q"):
                if getattr(t, name) is not None:
                    getattr(t, name).zero_()
            t.slot_mapping.fill_(-1)
        sync(self.loop.device)

    def one_row(self) -> None:
        """Row 0 of the decode buffers: one sequence at position 40 of a context in blocks 1-3 (fixed ids)."""
        t, bs = self.runner.static, self.runner.block_size
        t.text_ids[0], t.audio_ids[0], t.positions[0] = 5, 7, 40
        t.slot_mapping[0] = 1 * bs + 40 if 40 < bs else (1 + 40 // bs) * bs + 40 % bs
        t.block_tables[0, :3] = torch.tensor([1, 2, 3], dtype=torch.int32, device=t.block_tables.device)
        t.context_lens[0] = 41
        sync(self.loop.device)

    def carveout(self) -> int:
        return torch.cuda.get_device_properties(0).multi_processor_count - self.green_sms

    def products(self) -> dict:
        """services/common/matmul_check's bf16 products (eager) on the whole GPU, on the green stream, and on the
        green stream with the carveout: "right" or the fault."""
        from services.common.matmul_check import MatmulFault, check_matmul

        out = {}
        for name, where, carve in (("whole", "whole", None), ("green", "green", None),
                                   ("green carveout", "green", self.carveout())):
            torch._C._set_sm_carveout_experimental(carve)
            try:
                with self.scope(where):
                    check_matmul(torch.device("cuda"))
                out[name] = "right"
            except MatmulFault as fault:
                out[name] = str(fault)[:160]
            finally:
                torch._C._set_sm_carveout_experimental(None)
                sync(self.loop.device)
        return out

    def use(self, graphs: str) -> None:
        self.runner.graphs, self.runner.packed_graphs = self.sets[graphs]

    def scope(self, where: str):
        """"whole": the primary context and its default stream; "green": the green context current, its stream."""
        import contextlib

        if where == "whole":
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(self.green.current())
        stack.enter_context(torch.cuda.stream(self.green.stream))
        return stack

    def timed(self, batch: int, seconds: float, graphs: str, where: str) -> dict:
        self.use(graphs)
        self.loop.batch = batch
        with torch.inference_mode(), self.scope(where):
            self.loop.prepare()
            out = self.loop.run(seconds)
            sync(self.loop.device)
        self.use("whole")
        return {**out, "batch": batch, "graphs": graphs, "where": where}

    def alternate(self, batch: int, steps: int) -> dict:
        """Steps switching between the whole GPU and green every step; each stream waits for the other's last step
        (the engine launches a step ahead: the next step's inputs are the last one's samples, on the device)."""
        e, whole = self.loop.engine, torch.cuda.current_stream()
        self.loop.batch = batch
        with torch.inference_mode():
            self.loop.prepare()
            start = time.perf_counter()
            for i in range(steps):
                green = i % 2 == 1
                if green:
                    self.green.stream.wait_stream(whole)
                    self.use("green")
                    with self.scope("green"):
                        e.step()
                else:
                    whole.wait_stream(self.green.stream)
                    self.use("whole")
                    e.step()
            sync(self.loop.device)
            wall = time.perf_counter() - start
        self.use("whole")
        return {"loop": "llm", "steps": steps, "ms": wall / steps * 1e3, "batch": batch, "graphs": "alternating",
                "where": "alternating"}

    def outputs_agree(self) -> dict:
        """Every captured set's bucket-1 decode graph replayed on the same static inputs (the steps before left real
        inputs in the static buffers), each on its own context and stream, and the same step eagerly on the whole GPU
        and on green: the audio hidden state's max abs difference from the whole GPU's graph (its second replay
        first: is the comparison itself exact?)."""
        key = next(k for k in self.sets["whole"][0] if k[0] == 1)
        r = self.runner

        # (each read on the stream that computed it, and that stream waited for: a device synchronize on the primary
        # context does not wait for a green context's streams)
        def replay(name: str) -> torch.Tensor:
            graph, out = self.sets[name][0][key]
            with torch.inference_mode(), self.scope("whole" if name == "whole" else "green"):
                graph.replay()
                got = out[1].float().clone()
                torch.cuda.current_stream().synchronize()
            return got

        def eager(where: str) -> torch.Tensor:
            with torch.inference_mode(), self.scope(where):
                got = r._decode_forward(r._bucket_view(1), key[1])[1].float().clone()
                torch.cuda.current_stream().synchronize()
            return got

        self.one_row()
        ref = replay("whole")
        result = {"max_abs": float(ref.abs().max())}
        diff = lambda t: round(float((t - ref).abs().max()), 5)  # noqa: E731
        result["whole again"] = diff(replay("whole"))
        result["eager whole"] = diff(eager("whole"))
        result["eager green"] = diff(eager("green"))
        for name in self.sets:
            if name != "whole":
                result[name] = diff(replay(name))
        return result


def child(args) -> None:
    device = torch.device("cuda")
    if args.role == "vocoder":
        loop = VocoderLoop(args.size, device, args.windows)
    else:
        llm = LlmLoop(args.size, device, args.batch, args.context, args.kv_gb)
        loop = Shares(llm, args.green_sms)
    from services.common.matmul_check import MatmulFault, check_matmul

    try:
        check_matmul(device)
        products = "right"
    except MatmulFault as fault:
        products = str(fault)
    print(json.dumps({"ready": args.role, "products": products}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        what = cmd["do"]
        if what == "quit":
            break
        try:
            if what == "capture-green":
                result = {"seconds": loop.capture_green(cmd.get("carveout", False), cmd.get("pdl", True),
                                                        cmd.get("name", "green"))}
            elif what == "products":
                result = loop.products()
            elif what == "agree":
                result = loop.outputs_agree()
            elif what == "alternate":
                result = loop.alternate(cmd["batch"], cmd["steps"])
            elif what == "run" and args.role == "vocoder":
                loop.prepare()
                if cmd.get("wait"):
                    print(json.dumps({"prepared": True}), flush=True)
                    sys.stdin.readline()
                result = loop.run(args.seconds)
            elif what == "run":
                if cmd.get("wait"):  # beside: prepare first, then start when the parent says so
                    loop.use(cmd["graphs"])
                    loop.loop.batch = cmd["batch"]
                    with torch.inference_mode(), loop.scope(cmd["where"]):
                        loop.loop.prepare()
                        print(json.dumps({"prepared": True}), flush=True)
                        sys.stdin.readline()
                        result = {**loop.loop.run(args.seconds), **{k: cmd[k] for k in ("batch", "graphs", "where")}}
                    loop.use("whole")
                else:
                    result = loop.timed(cmd["batch"], args.seconds, cmd["graphs"], cmd["where"])
            else:
                result = {"error": f"unknown command {what}"}
        except Exception as exc:  # a study: report and go on to the next arm
            result = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps({"result": result}), flush=True)


# ---- the parent ---------------------------------------------------------------------------------------------------

class Child(gpu_sharing.Child):
    """A child of this study's: gpu_sharing's reading of its lines, JSON commands."""

    def __init__(self, role: str, args, env: dict, green_sms: int = 0):  # (not gpu_sharing's: other flags)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--role", role, "--size", args.size, "--batch",
               str(args.batch), "--context", str(args.context), "--windows", str(args.windows), "--seconds",
               str(args.seconds), "--kv-gb", str(args.kv_gb), "--green-sms", str(green_sms)]
        self.role = role
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, **env})
        self.products = self.read()["products"]

    def send(self, **cmd) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def ask(self, **cmd) -> dict:
        self.send(**cmd)
        return self.read()["result"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.send(do="quit")
            self.proc.wait(60)


def beside(llm: Child, vocoder: Child, **cmd) -> tuple[dict, dict]:
    llm.send(do="run", wait=True, **cmd)
    vocoder.send(do="run", wait=True)
    llm.read(), vocoder.read()  # both prepared
    for c in (llm, vocoder):
        c.proc.stdin.write("go\n")
    for c in (llm, vocoder):
        c.proc.stdin.flush()
    return llm.read()["result"], vocoder.read()["result"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=["real", "tiny"], default="real")
    p.add_argument("--batch", type=int, default=32, help="the larger batch of decoding sequences (and beside)")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--kv-gb", type=float, default=8.0)
    p.add_argument("--windows", type=int, default=6, help="streams in each vocoder call (the stack's size at load)")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--green-sms", type=int, default=33, help="the green context's multiprocessors (25%% of an H200's)")
    p.add_argument("--check", action="store_true",
                   help="only the llm at 100%%: its products and outputs on the green context, with cuBLAS's SM carveout "
                        "and with PDL off, then their step times and the vocoder beside the carveout's graphs")
    p.add_argument("--json")
    p.add_argument("--role", choices=["llm", "vocoder"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role:
        return child(args)
    from services.mps import MpsDaemon

    out = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "arms": [], "products": {},
           "gpu": subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip()}

    def arm(name: str, result: dict) -> None:
        out["arms"].append({"arm": name, **result})
        log(f"{name}: {result}")

    batches = (1, args.batch)
    if args.check:
        with MpsDaemon() as mps:
            llm = Child("llm", args, {**mps.env(), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}, args.green_sms)
            try:
                arm("products", llm.ask(do="products"))
                arm("llm 100% whole, b1", llm.ask(do="run", batch=1, graphs="whole", where="whole"))
                for name, opts in (("green", {}), ("green carveout", {"carveout": True}), ("green no pdl", {"pdl": False}),
                                   ("green carveout no pdl", {"carveout": True, "pdl": False})):
                    arm(f"capture {name}", llm.ask(do="capture-green", name=name, **opts))
                arm("outputs against the whole GPU's graph", llm.ask(do="agree"))
                for name in ("green carveout", "green no pdl"):
                    for b in batches:
                        arm(f"llm 100% {name}, b{b}", llm.ask(do="run", batch=b, graphs=name, where="green"))
                vocoder = Child("vocoder", args, mps.env())
                try:
                    arm("vocoder alone", vocoder.ask(do="run"))
                    for name in ("green", "green carveout"):
                        l_r, v_r = beside(llm, vocoder, batch=args.batch, graphs=name, where="green")
                        arm(f"beside: llm 100% {name}, b{args.batch}", l_r)
                        arm(f"beside: vocoder (llm {name})", v_r)
                finally:
                    vocoder.close()
            finally:
                llm.close()
        return report(out, args)
    with MpsDaemon() as mps:
        vocoder = Child("vocoder", args, mps.env())
        out["products"]["vocoder"] = vocoder.products
        try:
            arm("vocoder alone", vocoder.ask(do="run"))
            llm = Child("llm", args, {**mps.env(), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"})
            out["products"]["llm 25%"] = llm.products
            try:
                for b in batches:
                    arm(f"llm 25%, b{b}", llm.ask(do="run", batch=b, graphs="whole", where="whole"))
                l_r, v_r = beside(llm, vocoder, batch=args.batch, graphs="whole", where="whole")
                arm(f"beside: llm 25%, b{args.batch}", l_r)
                arm("beside: vocoder (llm 25%)", v_r)
            finally:
                llm.close()
            llm = Child("llm", args, {**mps.env(), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}, args.green_sms)
            out["products"]["llm 100%"] = llm.products
            try:
                for b in batches:
                    arm(f"llm 100% whole, b{b}", llm.ask(do="run", batch=b, graphs="whole", where="whole"))
                for b in batches:
                    arm(f"llm 100% green replay, b{b}", llm.ask(do="run", batch=b, graphs="whole", where="green"))
                arm("capture on green", llm.ask(do="capture-green"))
                for b in batches:
                    arm(f"llm 100% green, b{b}", llm.ask(do="run", batch=b, graphs="green", where="green"))
                arm("outputs whole vs green", llm.ask(do="agree"))
                arm("alternating, b1", llm.ask(do="alternate", batch=1, steps=200))
                arm("whole after green, b1", llm.ask(do="run", batch=1, graphs="whole", where="whole"))
                l_r, v_r = beside(llm, vocoder, batch=args.batch, graphs="green", where="green")
                arm(f"beside: llm 100% green, b{args.batch}", l_r)
                arm("beside: vocoder (llm green)", v_r)
                l_r, v_r = beside(llm, vocoder, batch=args.batch, graphs="whole", where="whole")
                arm(f"beside: llm 100% whole, b{args.batch}", l_r)
                arm("beside: vocoder (llm 100% whole)", v_r)
            finally:
                llm.close()
        finally:
            vocoder.close()
    report(out, args)


def report(out: dict, args) -> None:
    print(f"\n{out['gpu']}, {out['date']}: the llm's decode (real size, bf16, graphs) at MPS 25% and at 100% on the "
          f"whole GPU or a green context of {args.green_sms} multiprocessors; the vocoder's flow calls of "
          f"{args.windows} streams; products: {out['products']}\n")
    print("| arm | ms a step / call | note |\n| --- | --- | --- |")
    for a in out["arms"]:
        ms = f"{a['ms']:.2f}" if "ms" in a else ""
        note = {k: v for k, v in a.items() if k not in ("arm", "ms", "loop", "seconds")}
        print(f"| {a['arm']} | {ms} | {json.dumps(note)} |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
