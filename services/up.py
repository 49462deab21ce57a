"""`moss-serve up`: the services as processes on one host (llm and vocoder once, or once per GPU), kept running
(supervisor.py), sharing each GPU through CUDA MPS (mps.py) on CUDA, and stopped together."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time

from services.common.errors import DeviceLost
from services.encoder.settings import EncoderSettings
from services.gateway.settings import GatewaySettings
from services.llm.settings import LlmSettings
from services.settings import forward
from services.supervisor import report
from services.vocoder.settings import VocoderSettings

SERVICES_ON_GPU = ("llm", "vocoder", "encoder")
POLL_SECONDS = 0.1  # how often up looks at its services: a death is noticed (and the spare told to go) this soon
CPU_START_QUIET = 0.005  # --admit-start-quiet on a CPU: a burst's refusals before its admitted turns' start (admission.py)
GPU_STARTING_TURNS = 16  # --max-starting-turns on a GPU: a burst of 128 at once on an H100 played 100% stall-free
# Cores a turn needs (the headroom rule's start and a burst's most, where `up` runs the stack on a CPU): each stage has
# its share of the cores (one thread each on 2), and the vocoder's one thread spends ~0.4 s on each second of a
# stream's audio. On 2 cores, 2 turns started by a burst stalled in 3 of 11 bursts of 96 on 2026-11-30 (the first
# turn's second chunk waited behind the second's first; started one after the other, 2 of 12, the second turn's), 1 in
# none of 12 (docs/benchmarks.md, cpu-bursts-2026-11-30). The rule learns more from there where the stages have room.
CPU_CORES_PER_TURN = 2
# On a GPU the vocoder's first chunks run on a lane of their own (--first-chunk-lane on): under headroom admission on an
# H100 it admitted 14-16% more turns at Poisson 30-40 a second and 27% more of a 256-stream ramp, all stall-free, with
# TTFA p95 282-293 ms against 287-312 ms (docs/benchmarks.md).


def up_service_args(args) -> dict[str, list[str]]:
    """The flags `moss-serve up` gives its services (by service: every replica of it)."""
    llm = ["--device", args.device, *forward(args, LlmSettings)]
    vocoder = ["--device", args.device, "--preset", vocoder_preset(args), *forward(args, VocoderSettings)]
    encoder = ["--device", args.device, "--preset", encoder_preset(args), *forward(args, EncoderSettings)]
    gateway = forward(args, GatewaySettings)
    gateway += ["--admission", "headroom"] if args.admission is None else []  # on every device; a bare gateway: count
    if args.device == "cuda":  # admission measured on an H100 and an H200 (docs/benchmarks.md)
        gateway += ["--max-starting-turns", str(GPU_STARTING_TURNS)] if args.max_starting_turns is None else []
        vocoder += ["--first-chunk-lane", "on"] if args.first_chunk_lane is None and args.flow_solve != "on" else []
    else:  # a CPU plays a stream per two cores: the rule starts there, and a burst on an idle stack gets no more
        turns = str(cpu_turns())
        gateway += [*(["--admit-initial-turns", turns] if args.admit_initial_turns is None else []),
                    *(["--admit-burst-turns", turns] if args.admit_burst_turns is None else []),
                    *(["--admit-start-quiet", str(CPU_START_QUIET)] if args.admit_start_quiet is None else [])]
    if args.model_dir:
        llm += ["--model-dir", args.model_dir]
    if args.vocoder_dir:
        vocoder += ["--vocoder-dir", args.vocoder_dir]
    if args.encoder_dir:
        encoder += ["--encoder-dir", args.encoder_dir]
    if tls := stack_tls(args):
        llm += tls.server_flags(mutual=True)
        vocoder += tls.server_flags(mutual=True)
        encoder += tls.server_flags(mutual=True)
        gateway += tls.server_flags(mutual=False) + tls.backend_flags()
    return {"llm": llm, "vocoder": vocoder, "encoder": encoder, "gateway": gateway}


def cpu_turns() -> int:
    """Turns the stack's CPU plays at once, by the cores this process may run on."""
    return max(1, len(os.sched_getaffinity(0)) // CPU_CORES_PER_TURN)


def http_url(args) -> str:
    """Where the gateway's HTTP door answers (its OpenAI-compatible base URL is this + /v1)."""
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    return f"{'https' if args.tls_dir else 'http'}://{host}:{args.http_port}"


def stack_tls(args):
    from services.common.tls import StackTls

    return StackTls(args.tls_dir) if args.tls_dir else None


def vocoder_preset(args) -> str:
    """The codec's decoder (flow + HiFT) at the llm's size: tiny-codec for the tiny llm, whose 1,024 codes it covers;
    the real one (which covers the tiny codes too) for anything else and for a checkpoint. The stand-in decoder
    (the vocoder's own `--preset tiny`) is not chosen by `up`."""
    return "tiny-codec" if not args.model_dir and args.preset == "tiny" else "moss-speech"


def encoder_preset(args) -> str:
    """The speech encoder at the llm's size: tiny for the tiny llm (its codes are the tiny llm's audio tokens), the
    real one for anything else."""
    return "tiny" if not args.model_dir and args.preset == "tiny" else "moss-speech"


def replicas(args) -> int:
    """llm and vocoder processes each: one per GPU of --gpus, else --replicas. Raises ValueError."""
    if not args.gpus:
        return args.replicas
    if args.device != "cuda":
        raise ValueError("--gpus needs --device cuda")
    if args.replicas not in (1, len(args.gpus)):
        raise ValueError(f"--replicas {args.replicas} but {len(args.gpus)} --gpus")
    return len(args.gpus)


def gpu_env(args, names: list[str]) -> dict[str, dict[str, str]]:
    """With --gpus: each llm and vocoder process sees only its own GPU (replica k: the k-th of the list)."""
    from services.stack import replica_number, service_of

    if not args.gpus:
        return {}
    return {name: {"CUDA_VISIBLE_DEVICES": args.gpus[replica_number(name) - 1]} for name in names
            if service_of(name) in SERVICES_ON_GPU}


def run_up(args) -> int:
    from services.common.device import unusable
    from services.stack import SERVICES, Ports, ServiceExited, Stack, instances

    try:
        n = replicas(args)
        extra, tls = up_service_args(args), stack_tls(args)
        check_mps(args)
    except ValueError as e:
        print(f"moss-serve up: {e}", file=sys.stderr)
        return 2
    if problem := unusable(args.device):  # (before anything starts: each service would say it in a traceback)
        print(f"moss-serve up: {problem}", file=sys.stderr)
        return 2
    if not args.model_dir:
        print(f"moss-serve up: no --model-dir: the llm serves the {args.preset!r} preset with RANDOM weights", file=sys.stderr)
    if not args.vocoder_dir:
        print(f"moss-serve up: no --vocoder-dir: the vocoder serves the {vocoder_preset(args)!r} preset with RANDOM weights",
              file=sys.stderr)
    if not args.encoder_dir and not args.no_encoder:
        print(f"moss-serve up: no --encoder-dir: the encoder serves the {encoder_preset(args)!r} preset with RANDOM weights",
              file=sys.stderr)
    counts = {service: n for service in ("llm", "vocoder")}
    ports = Ports.spaced({s: getattr(args, f"{s}_port") for s in SERVICES},
                         {s: getattr(args, f"{s}_metrics_port") for s in SERVICES}, counts, http=args.http_port)
    from services.mps import MpsUnavailable

    try:
        mps = start_mps(args)
    except ValueError as e:
        print(f"moss-serve up: {e}", file=sys.stderr)
        return 2
    except MpsUnavailable as e:
        print(f"moss-serve up: {e}", file=sys.stderr)
        return 1
    env = {**gpu_env(args, instances(counts))}
    follows = llm_follows_load(args, mps)
    if follows:
        extra["llm"] += ["--busy-share", str(args.mps_llm_threads)]
    for name, extra_env in mps_env(args, mps, follows).items():
        env[name] = {**extra_env, **env.get(name, {})}
    health = {"llm": tls.client(mutual=True), "vocoder": tls.client(mutual=True), "encoder": tls.client(mutual=True),
              "gateway": tls.client(mutual=False)} if tls else {}
    spares = args.spares if args.spares is not None else args.device == "cuda"
    stack = Stack(ports, host=args.host, extra_args=extra, env=env, health_tls=health, replicas=counts,
                  without=("encoder",) if args.no_encoder else (), spares=SERVICES_ON_GPU if spares else (),
                  cpu_threads=args.cpu_threads)
    stopping, hangups = [], []
    # Ctrl-C (SIGINT) stops up even where it was started with SIGINT ignored, as a shell's background job is (and so
    # a test runner's worker process): Python then leaves it ignored, and `kill -INT` would do nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGHUP, lambda *_: hangups.append(True))  # a rolling restart (rolling_restart.py), once serving
    try:
        stack.start_all(args.start_timeout)
        where = ", ".join(f"{name} on {stack.target(name)}" for name in ["gateway", *stack.names[:-1]])
        http = f"; HTTP on {http_url(args)} (the web page; OpenAI's API under /v1)" if args.http_port else ""
        print(f"moss-serve up: {where}{http}; Ctrl-C stops; SIGHUP (kill -HUP {os.getpid()}) restarts the llm and "
              f"vocoder replicas one at a time", file=sys.stderr)
        keep_running(stack, mps, stopping, gpu_groups(args, stack.names), hangups, args.start_timeout,
                     args.mps_shared_fate)
    except KeyboardInterrupt:
        pass
    except ServiceExited as e:  # its reason is in its own lines above: one line here, not a traceback
        print(f"moss-serve up: {e}", file=sys.stderr)
        return 1
    finally:
        stack.stop_all()
        if mps:
            mps.stop()  # after the services: the daemon waits for its clients
        print("moss-serve up: stopped", file=sys.stderr)
    return 0


def check_mps(args) -> None:
    """ValueError for MPS flags that do not go together (before anything starts)."""
    if not args.mps:
        return
    if args.device != "cuda":
        raise ValueError("--mps needs --device cuda")
    for flag in ("mps_llm_threads", "mps_vocoder_threads"):
        if not 1 <= getattr(args, flag) <= 100:
            raise ValueError(f"--{flag.replace('_', '-')} is a percentage, 1 to 100")


def start_mps(args):
    """The stack's MPS daemon, started → MpsDaemon, or None without MPS. Raises MpsUnavailable if the daemon did not
    start (its flags: check_mps)."""
    if args.mps is None and args.device == "cuda":  # the default: MPS where it can run
        from services.mps import CONTROL

        args.mps = shutil.which(CONTROL) is not None
        if not args.mps:
            print(f"moss-serve up: {CONTROL} not found: llm and vocoder will take turns on the GPU, which carries "
                  f"fewer streams (docs/benchmarks.md); --no-mps silences this", file=sys.stderr)
    if not args.mps:
        return None
    from services.mps import MpsDaemon

    check_mps(args)
    mps = MpsDaemon()
    mps.start()
    print(f"moss-serve up: llm and vocoder share the GPU through CUDA MPS (the vocoder's kernels on at most "
          f"{args.mps_vocoder_threads}% of its multiprocessors at once)", file=sys.stderr)
    return mps


def llm_follows_load(args, mps) -> bool:
    """Whether the llm runs at MPS 100% with --busy-share (--mps-llm-follows-load, where green contexts can be made):
    says which share the llm's steps get, and why."""
    if not mps:
        return False
    fixed = f"moss-serve up: the llm's kernels on at most {args.mps_llm_threads}% of the multiprocessors at every load"
    if not args.mps_llm_follows_load or args.mps_llm_threads >= 100:
        print(fixed, file=sys.stderr)
        return False
    from services.common.green_context import unavailable

    if reason := unavailable():
        print(f"{fixed}: {reason}", file=sys.stderr)
        return False
    print(f"moss-serve up: the llm's steps take the whole GPU while at most {args.whole_gpu_turns} sequences ran in the "
          f"last 2 s, else {args.mps_llm_threads}% of its multiprocessors (--no-mps-llm-follows-load: always "
          f"{args.mps_llm_threads}%)", file=sys.stderr)
    return True


def mps_env(args, mps, llm_follows_load: bool = False) -> dict[str, dict[str, str]]:
    """Each GPU service's MPS environment: the daemon's pipes, and a cap on the share of the multiprocessors its
    kernels hold at once (none for an llm that moves between the whole GPU and its share itself)."""
    if not mps:
        return {}
    env = {"llm": mps.env(), "vocoder": mps.env(), "encoder": mps.env()}
    for name, percent in (("llm", 100 if llm_follows_load else args.mps_llm_threads),
                          ("vocoder", args.mps_vocoder_threads)):
        if percent < 100:
            env[name] = {**env[name], "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(percent)}
    return env


def keep_running(stack, mps, stopping: list, groups: list[list[str]], hangups: list | None = None,
                 start_timeout: float = 120.0, shared_fate: bool = False) -> None:
    """Until SIGTERM (or Ctrl-C): a service that exits is started again, with backoff, while the others keep
    serving; under MPS, see MpsKeeper. groups: the GPU services of each GPU. hangups: filled by the SIGHUP handler,
    each a rolling restart of the replicas (rolling_restart.py)."""
    from services.rolling_restart import RollingRestart, replica_groups
    from services.supervisor import Supervisor

    supervisor = Supervisor(stack)
    keeper = MpsKeeper(mps, stack, supervisor, groups, shared_fate=shared_fate) if mps else None
    rolling = RollingRestart(stack, supervisor, replica_groups(stack.names), start_timeout)
    hangups = [] if hangups is None else hangups
    while not stopping:
        while hangups:
            hangups.pop()
            rolling.request()
        supervisor.poll()
        if keeper is not None:
            keeper.poll()
        rolling.poll()
        time.sleep(POLL_SECONDS)


def gpu_groups(args, names: list[str]) -> list[list[str]]:
    """The llm and vocoder processes that share each GPU: one group per --gpus entry, else one of them all."""
    from services.stack import replica_number, service_of

    on_gpu = [name for name in names if service_of(name) in SERVICES_ON_GPU]
    if not args.gpus:
        return [on_gpu]
    return [[name for name in on_gpu if replica_number(name) == k] for k in range(1, len(args.gpus) + 1)]


class MpsKeeper:
    """What MPS adds to supervision: one GPU's llm and vocoder processes are clients of one MPS server, and
    may share its fate.

    - A client that exits because its GPU context was lost (exit code 3: a fatal GPU exception, which MPS reports to
      every client of the server) takes the others of its GPU with it: they are stopped, and the supervisor starts
      them all again (with its backoff) as clients of a fresh server. A faulted server takes no new client until
      all of its old ones are gone (CUDA error 807, "MPS server is not ready to accept new MPS client requests").
      (Each also finds a faulted context by itself within PROBE_SECONDS, idle or not: services/common/device.py;
      this is sooner.) A client the server refuses at its start exits 3 too (cli.py), and so does one that aborts
      (SIGABRT: PyTorch's destructors throwing on a sticky CUDA error): either way the clients still holding the
      faulted server must go, or no new one is ever taken (an H200's encoder held one for minutes while the llm and
      the vocoder were refused at each restart).
    - A client killed by a signal takes the others with it only with `shared_fate` (--mps-shared-fate). Off by
      default: on an H200 five SIGKILLs under load (two of the vocoder, three of the llm) left the other stage
      serving with no CUDA error, and only the dead one was started again (docs/benchmarks.md, restart-2026-11-29),
      where an H100 once saw an llm replica's kill give its neighbours an illegal memory access (two llm and two
      vocoder replicas on the GPU: a layout not tried again). If a kill does fault a neighbour, that neighbour
      finds it within PROBE_SECONDS and exits 3, and the rule above restarts the GPU's clients. A plain exit (a
      Python error) leaves the others alone.
    - The daemon itself is started again when it exits (after 1 s, doubling to 30 s while it keeps failing to
      start), then every client."""

    def __init__(self, mps, stack, supervisor, groups: list[list[str]],
                 log=report,
                 first_backoff: float = 1.0, max_backoff: float = 30.0, shared_fate: bool = False):
        self.mps, self.stack, self.supervisor, self.groups, self.log = mps, stack, supervisor, groups, log
        self.shared_fate = shared_fate
        self.first_backoff, self.max_backoff = first_backoff, max_backoff
        self.backoff, self.retry_at = first_backoff, None
        self.restarts = 0
        self.handled: set[int] = set()  # id() of the exited processes already dealt with

    def poll(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._keep_daemon(now)
        if self.retry_at is None:
            self._share_fate()

    def _takes_others(self, code: int) -> bool:
        # SIGABRT too: a client aborts when PyTorch's destructors throw on a sticky CUDA error (cli.py's exit_now is
        # there to exit 3 first, but an abort can still come from a thread's work)
        return code in (DeviceLost.EXIT_CODE, -signal.SIGABRT) or (self.shared_fate and code < 0)

    def _share_fate(self) -> None:
        for group in self.groups:
            procs = {name: self.stack.procs.get(name) for name in group}
            dead = [name for name, proc in procs.items()
                    if proc is not None and proc.poll() is not None and id(proc) not in self.handled
                    and self._takes_others(proc.returncode)]
            if not dead:
                continue
            self.handled.update(id(procs[name]) for name in dead)
            others = [name for name, proc in procs.items() if proc is not None and proc.poll() is None]
            if others:
                self.log(f"{', '.join(dead)} died ({', '.join(str(procs[n].returncode) for n in dead)}); stopping "
                         f"{', '.join(others)} too: they share its GPU's MPS server, which it may have left faulted")
                for name in others:  # stopped, not failed: started again at once, not after a failure's backoff
                    self.supervisor.expect_exit(name)
                self.stack.stop(*others)  # the supervisor starts them all again

    def _keep_daemon(self, now: float) -> None:
        from services.mps import MpsUnavailable

        if self.retry_at is None:
            if self.mps.proc is not None and self.mps.proc.poll() is None:
                return
            code = self.mps.proc.returncode if self.mps.proc is not None else None
            self.log(f"the MPS daemon exited with code {code}; starting it again")
            self.retry_at = now
        if now < self.retry_at:
            return
        try:
            self.mps.start()
        except MpsUnavailable as e:
            self.log(f"{e}; trying again in {self.backoff:.0f} s")
            self.retry_at, self.backoff = now + self.backoff, min(self.backoff * 2, self.max_backoff)
            return
        self.retry_at, self.backoff = None, self.first_backoff
        self.restarts += 1
        gpu = [name for group in self.groups for name in group]
        self.log(f"the MPS daemon is back; restarting {', '.join(gpu)} as its clients")
        self.stack.stop(*gpu)
        for name in gpu:
            self.stack.start(name)
            self.supervisor.started(name, now)
