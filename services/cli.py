"""moss-serve: start one service, the whole stack, or speak a sentence through a running gateway.

    moss-serve llm|vocoder|encoder|gateway [options]   one service
    moss-serve up [options]                    all four as separate processes; Ctrl-C stops them
    moss-serve say "text" -o out.wav           synthesize through the gateway at localhost:50051
    moss-serve chat                            a typed spoken conversation (services/chat.py)
    moss-serve voice WAV --name N ...          a voice for the codec's decoder from a recording
    moss-serve bench [options]                 load the gateway, measure at the client (services/bench/)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import io
import os
import signal
import sys

from services.client_commands import add_bench, add_chat, add_say, run_bench, run_chat, run_say
from services.encoder.settings import EncoderSettings
from services.gateway.settings import ENCODER_TARGET, LLM_TARGET, VOCODER_TARGET, GatewaySettings
from services.llm.settings import LlmSettings
from services.settings import (
    ADMISSION,
    DOORS,
    ENCODER,
    FORWARDED,
    GRPC_PORTS,
    HTTP_PORT,
    LLM,
    METRICS_PORTS,
    PROCESSES,
    SECURITY,
    VOCODER,
    add_flags,
    argument_group,
    count,
    from_args,
    gpu_list,
    positive,
    targets,
)
from services.vocoder.settings import VocoderSettings

GROUP_ORDER = (PROCESSES, LLM, VOCODER, ENCODER, ADMISSION, DOORS, SECURITY)  # as --help lists them


def _groups_in_order(p: argparse.ArgumentParser, titles=GROUP_ORDER) -> None:
    for title in titles:
        argument_group(p, title)


def _service(p: argparse.ArgumentParser, settings) -> None:
    """A service's command: its declared options (services/<service>/settings.py), logging and TLS."""
    own = {settings.GROUP, *getattr(settings, "GROUPS", {})}
    _groups_in_order(p, [t for t in GROUP_ORDER if t in own or t in (PROCESSES, SECURITY)])
    add_flags(p, settings)
    argument_group(p, PROCESSES).add_argument("--log-level", default="INFO", help="the log's level (default INFO)")
    tls = argument_group(p, SECURITY)
    tls.add_argument("--tls-cert", help="PEM certificate chain: serve TLS on the gRPC port (services/common/tls.py)")
    tls.add_argument("--tls-key", help="PEM private key of --tls-cert")
    tls.add_argument("--tls-client-ca", help="PEM CA: require client certificates it signed (mutual TLS)")


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="moss-serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = root.add_subparsers(dest="command", required=True)

    _service(sub.add_parser("llm", help="the llm service"), LlmSettings)
    _service(sub.add_parser("vocoder", help="the vocoder service"), VocoderSettings)
    _service(sub.add_parser("encoder", help="the speech encoder service (spoken turns → audio codes)"), EncoderSettings)
    gw = sub.add_parser("gateway", help="the public gateway")
    _service(gw, GatewaySettings)
    backends, gw_tls = argument_group(gw, DOORS), argument_group(gw, SECURITY)
    backends.add_argument("--llm-target", type=targets, action="extend", dest="llm_targets", metavar="HOST:PORT[,...]",
                    help="llm replicas (repeat the flag, or separate with commas): a Converse session stays on one, new "
                         "sessions go to the least loaded, one that fails its health checks is skipped until it "
                         f"recovers (default {LLM_TARGET})")
    backends.add_argument("--vocoder-target", type=targets, action="extend", dest="vocoder_targets", metavar="HOST:PORT[,...]",
                    help=f"vocoder replicas, as --llm-target; each stream goes to the least loaded (default {VOCODER_TARGET})")
    backends.add_argument("--encoder-target", type=targets, action="extend", dest="encoder_targets", metavar="HOST:PORT[,...]",
                    help=f"encoder replicas for spoken turns, as --llm-target; each turn goes to the least loaded "
                         f"(default {ENCODER_TARGET})")
    gw_tls.add_argument("--backend-ca", help="PEM CA: reach llm and vocoder over TLS, checking their certificates")
    gw_tls.add_argument("--backend-cert", help="PEM certificate the gateway presents to llm and vocoder (mutual TLS)")
    gw_tls.add_argument("--backend-key", help="PEM private key of --backend-cert")

    up = sub.add_parser("up", help="start llm, vocoder, encoder and gateway as separate processes")
    _groups_in_order(up)
    processes = argument_group(up, PROCESSES)
    processes.add_argument("--host", default="127.0.0.1", help="the address every service binds (default 127.0.0.1)")
    for service in ("gateway", "llm", "vocoder", "encoder"):
        processes.add_argument(f"--{service}-port", type=int, default=GRPC_PORTS[service],
                               help=f"the {service}'s gRPC port (default {GRPC_PORTS[service]})")
        processes.add_argument(f"--{service}-metrics-port", type=int, default=METRICS_PORTS[service],
                               help=f"the {service}'s Prometheus /metrics port (default {METRICS_PORTS[service]})")
    argument_group(up, DOORS).add_argument(
        "--http-port", type=int, default=HTTP_PORT,
        help="the gateway's HTTP door: OpenAI's /v1/audio/speech, /healthz, /readyz (0: off)")
    processes.add_argument("--no-encoder", action="store_true",
                    help="start no speech encoder: typed turns only (a spoken turn fails UNAVAILABLE), its start-up "
                         "and GPU memory saved")
    processes.add_argument("--cpu-threads", type=count, default=None, metavar="N",
                    help="on a CPU, torch's threads in each llm, vocoder and encoder process (default: the cores "
                         "shared among the llm and vocoder processes, at least one each; 0: torch's default, every "
                         "core each)")
    processes.add_argument("--start-timeout", type=positive(float), default=300.0, metavar="SECONDS",
                    help="how long every service may take to say SERVING (a vocoder on a GPU captures its CUDA graphs "
                         "first: ~90 s at the real size); one that exits is reported at once (default 300)")
    argument_group(up, LLM).add_argument("--model-dir", help="the llm's checkpoint; without it: the --preset with random weights")
    argument_group(up, VOCODER).add_argument(
        "--vocoder-dir", help="the vocoder's directory (the codec's flow + HiFT, or BigVGAN-v2); without it: the vocoder "
                              "preset matching the llm (--preset, or moss-speech with --model-dir) with random weights")
    argument_group(up, ENCODER).add_argument("--encoder-dir", help="the speech encoder's directory (GLM-4-Voice's tokenizer: config.json, "
                                          "model*.safetensors); without it: the encoder preset matching the llm with "
                                          "random weights")
    processes.add_argument("--device", default="cpu", help="cpu or cuda, for llm, vocoder and encoder")
    processes.add_argument("--mps", action=argparse.BooleanOptionalAction, default=None,
                    help="run llm and vocoder as clients of a CUDA MPS daemon of the stack's own, so that their kernels "
                         "share the GPU instead of taking turns (needs nvidia-cuda-mps-control). Default: on with "
                         "--device cuda where the daemon is installed, with a warning where it is not")
    processes.add_argument("--mps-llm-threads", type=int, default=25, metavar="PERCENT",
                    help="with --mps: the share of the GPU's multiprocessors the llm's kernels may occupy at once "
                         "(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), leaving the rest to the vocoder (default 25; on an H100 "
                         "cuBLAS's products were wrong at 35-45, 55-75: a service refuses to start on such a share, "
                         "services/common/matmul_check.py)")
    processes.add_argument("--mps-vocoder-threads", type=int, default=100, metavar="PERCENT",
                    help="with --mps: the share the vocoder's kernels may occupy at once; with --mps-llm-threads "
                         "summing to 100 or less, neither takes the other's multiprocessors (default 100: no cap)")
    processes.add_argument("--mps-llm-follows-load", action=argparse.BooleanOptionalAction, default=True,
                    help="with --mps: the llm runs at MPS 100%% and its steps take the whole GPU while at most "
                         "--whole-gpu-turns sequences ran in the last 2 s, else --mps-llm-threads percent of its "
                         "multiprocessors (a CUDA green context: the llm's --busy-share); off: --mps-llm-threads for "
                         "every step. Default: on where the driver makes green contexts (CUDA 12.4 or newer)")
    processes.add_argument("--mps-shared-fate", action=argparse.BooleanOptionalAction, default=False,
                    help="with --mps: when one GPU's llm or vocoder is killed by a signal, stop the others of that GPU "
                         "too and start them all again on a fresh MPS server (default: off, only the dead one is started "
                         "again: on an H200 under load 14 of 19 vocoder kills and 6 of 7 llm kills faulted no neighbour, "
                         "and the dead one alone was back sooner). One that reports its GPU lost (exit code 3) takes the "
                         "others with it either way")
    processes.add_argument("--spares", action=argparse.BooleanOptionalAction, default=None,
                    help="keep a spare process for each llm, vocoder and encoder: started once the stack serves, it has "
                         "imported what the service runs on and waits, so that a restart skips those imports "
                         "(services/spare.py; a few hundred MB of host memory each). Default: on with --device cuda, off on a CPU")
    processes.add_argument("--replicas", type=positive(int), default=1,
                    help="llm and vocoder processes each, behind the one gateway; replica k serves on the ports given "
                         "plus 10 x (k - 1) (default 1)")
    processes.add_argument("--gpus", type=gpu_list, metavar="LIST",
                    help="with --device cuda: one llm and one vocoder on each of these GPUs (CUDA indices, "
                         "comma-separated, e.g. 0,1); sets --replicas to their number")
    argument_group(up, SECURITY).add_argument("--tls-dir", metavar="DIR",
                    help="TLS for the gateway's clients and mutual TLS between the services, from the files "
                         "deploy/docker-compose.tls.yml reads: ca.pem, server.pem + server.key (every service; its "
                         "names must cover --host), gateway-client.pem + .key (the gateway's, for llm and vocoder)")
    for settings in (LlmSettings, VocoderSettings, EncoderSettings, GatewaySettings):  # (each in its groups, as in its
        add_flags(up, settings, FORWARDED)                                           # own command's --help)

    add_say(sub)
    add_chat(sub)
    voice = sub.add_parser("voice", help="make a voice for the codec's flow decoder from a recording (WAV)",
                           description="A voice: the recording's codes (the encoder), its mel in the flow's format and "
                                       "its speaker x-vector (a speaker-embedding model in ONNX), saved as "
                                       "<voices-dir>/<name>.safetensors (services/voice_maker.py, docs/codec.md)")
    voice.add_argument("wav", help="a recording of the speaker: a few seconds, any rate, mono or mixed down")
    voice.add_argument("--name", required=True, help="the voice's name (letters, digits, '_', '.', '-')")
    voice.add_argument("--voices-dir", required=True, help="where the voice file goes (the vocoder's --voices-dir)")
    voice.add_argument("--speaker-model", required=True, metavar="ONNX",
                       help="the speaker-embedding model (CosyVoice2's campplus.onnx)")
    voice.add_argument("--encoder-dir", help="the speech tokenizer (as `moss-serve encoder --encoder-dir`); without "
                                             "it: --preset's encoder with random weights (tests only)")
    voice.add_argument("--vocoder-dir", help="the codec's directory, whose codec.json says the flow's format "
                                             "(default: --preset's)")
    voice.add_argument("--preset", choices=["tiny", "moss-speech"], default="moss-speech",
                       help="without --encoder-dir / --vocoder-dir: their sizes (default moss-speech)")
    voice.add_argument("--max-seconds", type=positive(float), default=30.0, help="longest recording taken (default 30)")
    voice.add_argument("--prompt-seconds", type=positive(float),
                       help="cut a longer recording to at most this, at its quietest 80 ms boundary in the last 2 s, as "
                            "the API cuts one to its vocoders' max_prompt_seconds (default: the whole recording)")

    add_bench(sub)
    return root


def run_service(args) -> int:
    from services.common.lifetime import die_with_parent
    from services.common.server import configure_logging

    die_with_parent()  # started by `moss-serve up` (or a test's stack): end with it, even if it is SIGKILLed
    # `kill -USR1 PID` writes every thread's Python stack to the service's stderr (its log), and it goes on: what a
    # service that stopped answering is waiting for, where no debugger can attach.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    from services.common.tls import channel_tls, server_tls

    if args.command == "gateway":
        for flag, targets in (("--llm-target", args.llm_targets or []), ("--vocoder-target", args.vocoder_targets or []),
                              ("--encoder-target", args.encoder_targets or [])):
            if len(set(targets)) != len(targets):
                print(f"moss-serve gateway: {flag}: an address given twice: {', '.join(targets)}", file=sys.stderr)
                return 2
    try:  # wrong TLS flags fail here, before a model loads
        tls = server_tls(args.tls_cert, args.tls_key, args.tls_client_ca)
        backend_tls = channel_tls(args.backend_ca, args.backend_cert, args.backend_key) if args.command == "gateway" else None
    except ValueError as e:
        print(f"moss-serve {args.command}: {e}", file=sys.stderr)
        return 2

    configure_logging(args.log_level)
    if args.command == "llm":
        from services.llm.server import run

        settings = from_args(LlmSettings, args, tls=tls)
    elif args.command == "vocoder":
        from services.vocoder.server import run

        settings = from_args(VocoderSettings, args, tls=tls)
    elif args.command == "encoder":
        from services.encoder.server import run

        settings = from_args(EncoderSettings, args, tls=tls)
    else:
        from services.gateway.server import run

        targets = {name: getattr(args, name) for name in ("llm_targets", "vocoder_targets", "encoder_targets")
                   if getattr(args, name)}
        settings = from_args(GatewaySettings, args, tls=tls, backend_tls=backend_tls, **targets)
    from services.common.errors import DeviceLost

    try:
        if args.command in ("llm", "vocoder", "encoder") and settings.device.startswith("cuda"):
            from services.common.device import unusable
            from services.common.matmul_check import check_matmul

            if problem := unusable(settings.device):  # (PyTorch's own error: pages of traceback at the first kernel)
                print(f"moss-serve {args.command}: {problem}", file=sys.stderr)
                if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
                    # `up` saw this GPU before starting anything: under its MPS daemon, a GPU that vanished is a server
                    # that takes no new client, as a faulted one does until all of its old clients are gone. Said as
                    # a lost GPU, so that up stops those clients too and starts them all on a fresh server (up.py's
                    # MpsKeeper); as a plain failure, up would start this one again and again while they lived.
                    print(f"moss-serve {args.command}: (its MPS server takes no new client: faulted?)", file=sys.stderr)
                    return exit_now(DeviceLost.EXIT_CODE)
                return 2
            check_matmul(settings.device)  # wrong products under some MPS shares: refuse to serve (matmul_check.py)
            if getattr(settings, "quantization", "none") == "fp8":  # the llm's FP8 GEMMs: cuBLASLt's own kernels
                from services.llm.runner.fp8 import check_fp8

                check_fp8(settings.device)
        asyncio.run(run(settings))
    except OSError as e:  # a port in use, most often: one line, not a traceback
        print(f"moss-serve {args.command}: {e}", file=sys.stderr)
        return 1
    except DeviceLost as e:  # its GPU context is gone: exit, to be started again on a fresh one (device.py)
        print(f"moss-serve {args.command}: {e}", file=sys.stderr)
        return exit_now(DeviceLost.EXIT_CODE)
    except ValueError as e:  # a model, voice or setting refused at start (a checkpoint's wrong tensors, a bad voice,
        # a GPU share whose matrix products are wrong)
        print(f"moss-serve {args.command}: cannot start: {e}", file=sys.stderr)
        return 2
    return 0


def read_ahead(argv: list[str]) -> None:
    """What a spare of this service does before it is told to serve (spare.py), on the CPU only: the vocoder reads its
    codec, the encoder its weights (common/read_ahead.py). Arguments it cannot take are left for the service's own
    start to refuse."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # (--help, errors)
            args = parser().parse_args(argv)
    except SystemExit:
        return
    if args.command == "vocoder":
        from services.vocoder.loader import codec_ahead

        s = from_args(VocoderSettings, args, tls=None)
        codec_ahead(s.vocoder_dir, s.preset, s.seed)
    elif args.command == "encoder":
        from services.encoder.server import model_ahead

        model_ahead(from_args(EncoderSettings, args, tls=None))


def exit_now(code: int) -> int:
    """Exit with `code` without the interpreter's teardown. After a sticky CUDA error that teardown runs PyTorch's
    destructors, which throw, and the process aborts (SIGABRT) instead of saying why it ends: an H200's vocoder whose
    GPU had failed died -6, not 3, and up left its neighbours on the faulted MPS server."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    if args.command == "up":
        from services.up import run_up

        return run_up(args)
    if args.command == "say":
        return run_say(args)
    if args.command == "chat":
        return run_chat(args)
    if args.command == "bench":
        return run_bench(args, argv[1:])
    if args.command == "voice":
        from services.voice_maker import run

        return run(args)
    return run_service(args)


if __name__ == "__main__":
    sys.exit(main())
