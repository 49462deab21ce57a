"""`moss-serve up`: the three services as processes on one host, kept running (supervisor.py), sharing a GPU
through CUDA MPS (mps.py) on CUDA, and stopped together."""

from __future__ import annotations

import shutil
import signal
import sys
import time

from services.cli import ENGINE_OPTIONS, VOCODER_PRESETS, WORKER_OPTIONS


def up_service_args(args) -> dict[str, list[str]]:
    """The llm's and the vocoder's flags under `moss-serve up`."""
    llm = ["--device", args.device]
    for name in ENGINE_OPTIONS:
        if getattr(args, name) is not None:  # None: the llm's own default
            llm += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    vocoder = ["--device", args.device, "--preset", vocoder_preset(args)]
    for name in WORKER_OPTIONS:
        vocoder += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.model_dir:
        llm += ["--model-dir", args.model_dir]
    if args.vocoder_dir:
        vocoder += ["--vocoder-dir", args.vocoder_dir]
    return {"llm": llm, "vocoder": vocoder}


def vocoder_preset(args) -> str:
    """The vocoder's codebook must cover the llm's audio codes: the llm's preset, or the real one
    (which covers the tiny codes too) for a checkpoint."""
    return "moss-speech" if args.model_dir or args.preset not in VOCODER_PRESETS else args.preset


def run_up(args) -> int:
    from services.stack import SERVICES, Ports, Stack
    from services.supervisor import Supervisor

    extra = up_service_args(args)
    if not args.model_dir:
        print(f"moss-serve up: no --model-dir: the llm serves the {args.preset!r} preset with RANDOM weights", file=sys.stderr)
    if not args.vocoder_dir:
        print(f"moss-serve up: no --vocoder-dir: the vocoder serves the {vocoder_preset(args)!r} preset with RANDOM weights",
              file=sys.stderr)
    ports = Ports({s: getattr(args, f"{s}_port") for s in SERVICES}, {s: getattr(args, f"{s}_metrics_port") for s in SERVICES})
    mps = None
    if args.mps is None and args.device == "cuda":  # the default: MPS where it can run
        from services.mps import CONTROL

        args.mps = shutil.which(CONTROL) is not None
        if not args.mps:
            print(f"moss-serve up: {CONTROL} not found: llm and vocoder will take turns on the GPU, which carries "
                  f"fewer streams (docs/benchmarks.md); --no-mps silences this", file=sys.stderr)
    if args.mps:
        from services.mps import MpsDaemon, MpsUnavailable

        if args.device != "cuda":
            print("moss-serve up: --mps needs --device cuda", file=sys.stderr)
            return 2
        if not 1 <= args.mps_llm_threads <= 100:
            print("moss-serve up: --mps-llm-threads is a percentage, 1 to 100", file=sys.stderr)
            return 2
        mps = MpsDaemon()
        try:
            mps.start()
        except MpsUnavailable as e:
            print(f"moss-serve up: {e}", file=sys.stderr)
            return 1
        print(f"moss-serve up: llm and vocoder share the GPU through CUDA MPS (the llm's kernels on at most "
              f"{args.mps_llm_threads}% of its multiprocessors at once)", file=sys.stderr)
    env = None
    if mps:
        env = {"llm": mps.env(), "vocoder": mps.env()}
        if args.mps_llm_threads < 100:
            env["llm"] = {**env["llm"], "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(args.mps_llm_threads)}
    stack = Stack(ports, host=args.host, extra_args=extra, env=env)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        stack.start_all()
        print(f"moss-serve up: gateway on {stack.target('gateway')}, llm on {stack.target('llm')}, "
              f"vocoder on {stack.target('vocoder')}; Ctrl-C stops", file=sys.stderr)
        supervisor = Supervisor(stack)
        while not stopping:
            supervisor.poll()  # a service that exits is started again, with backoff; the others keep serving
            if mps and mps.proc.poll() is not None:
                print(f"moss-serve up: the MPS daemon exited with code {mps.proc.returncode}; stopping", file=sys.stderr)
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stack.stop_all()
        if mps:
            mps.stop()  # after the services: the daemon waits for its clients
        print("moss-serve up: stopped", file=sys.stderr)
    return 0
