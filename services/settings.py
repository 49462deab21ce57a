"""Every setting declared once: a service's settings dataclass (services/<service>/settings.py) declares each of its
options with `option(...)`: its name (the field's), type, default and help. From that one declaration come the
service's command-line flags, `moss-serve up`'s flags for the options it hands on, `up`'s forwarding of them, and the
settings object a command builds from its parsed arguments. Declarations only: reading them builds no model
and opens no channel.

Scopes: FORWARDED options are taken by the service's command and by `up`, which hands them on; OWN ones by the
service's command alone (`up` sets them itself: devices, directories, targets); fields declared without `option`
(TLS objects, seeds) are no flag at all.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import MISSING, Field, field

FORWARDED = "forwarded"
OWN = "own"

# The groups every command's --help shows its flags in, by stage and concern (`moss-serve up --help` shows them all;
# each service's own --help, its own). A settings class puts its options in its GROUP, but for those its GROUPS name.
PROCESSES = "processes: addresses, devices, supervision"
LLM = "llm: weights and engine"
VOCODER = "vocoder and codec decoder"
ENCODER = "speech encoder"
ADMISSION = "gateway admission: who gets a place"
DOORS = "sessions and doors: requests, sessions, clients, backends"
SECURITY = "security: keys, TLS, origins"

# Every service's default ports, gRPC and Prometheus, in one place (the settings, `up`, the stack helpers and the
# gateway's default targets read them; tests/test_settings.py checks the compose file and the docs against them).
GRPC_PORTS = {"gateway": 50051, "llm": 50052, "vocoder": 50053, "encoder": 50054}
METRICS_PORTS = {"gateway": 9091, "llm": 9092, "vocoder": 9093, "encoder": 9094}
HTTP_PORT = 8000  # the gateway's HTTP door (OpenAI's /v1/audio/speech)
# The streams one GPU's stack is sized for by default: its vocoder keeps this many streams' flow histories
# (codec/decoder.py), its gateway runs as many turns (the vocoders' stream slots), and its encoder holds as many
# speakers' places, so that every stream it plays may be a spoken session's. Each is capped by its device's free memory.
GPU_STACK_STREAMS = 128


# ---- the options' types (argparse turns a type's error into a usage message) ----------------------------------
def _number(kind, text: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a{'n integer' if kind is int else ' number'}: {text!r}") from None


def positive(kind):
    """An argparse type: a positive, finite `kind` (argparse turns the error into a usage message)."""
    def parse(text: str):
        value = _number(kind, text)
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value
    return parse


def count(text: str) -> int:
    """An argparse type: a whole number, 0 or more (frames, requests, tokens)."""
    value = _number(int, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds, 0 or more."""
    value = _number(float, text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return value


def share(text: str) -> float:
    """An argparse type: a share, from 0 to 1."""
    value = _number(float, text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, got {text}")
    return value


def power_of_two(text: str) -> int:
    value = positive(int)(text)
    if value & (value - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two, got {value}")
    return value


def targets(text: str) -> list[str]:
    """An argparse type: HOST:PORT addresses, comma-separated."""
    targets = [part.strip() for part in text.split(",") if part.strip()]
    for target in targets:
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise argparse.ArgumentTypeError(f"not HOST:PORT: {target!r}")
    if not targets:
        raise argparse.ArgumentTypeError("no address given")
    return targets


def gpu_list(text: str) -> list[str]:
    """An argparse type: distinct CUDA device indices, comma-separated."""
    gpus = [part.strip() for part in text.split(",")]
    if not all(gpu.isdigit() for gpu in gpus) or len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"not distinct GPU indices: {text!r}")
    return gpus


def concurrencies(text: str) -> list[int]:
    """An argparse type: positive integers, comma-separated."""
    return [positive(int)(part.strip()) for part in text.split(",")]


def rates(text: str) -> list[float]:
    """An argparse type: positive numbers, comma-separated."""
    return [positive(float)(part.strip()) for part in text.split(",")]


def span(text: str) -> tuple[float, float]:
    """An argparse type: LO-HI, two positive numbers, LO <= HI (one number: LO = HI)."""
    lo, _, hi = text.partition("-")
    lo, hi = positive(float)(lo.strip()), positive(float)((hi or lo).strip())
    if lo > hi:
        raise argparse.ArgumentTypeError(f"not LO-HI with LO <= HI: {text!r}")
    return lo, hi


# ---- declarations ------------------------------------------------------------------------------------------
def option(default, help: str, type=None, choices=None, scope: str = FORWARDED, metavar: str | None = None,
           show_default: bool = True):
    """A dataclass field that is also a command-line option (--name-with-dashes). show_default: the help ends with
    the default (off where the help explains a default that depends on something else)."""
    return field(default=default, metadata=dict(help=help, type=type, choices=choices, scope=scope, metavar=metavar,
                                                show_default=show_default))


# Every service's own endpoint options, with its default ports.
def host_option():
    return option("127.0.0.1", "address to bind (0.0.0.0 in containers)", scope=OWN)


def port_option(service: str):
    return option(GRPC_PORTS[service], "gRPC port", type=int, scope=OWN)


def cpu_threads_option():
    """A torch stage's threads for its math on a CPU: every core by default, which several stages on one machine
    would each take (`moss-serve up` and the stack helpers give each its share: services/stack.py)."""
    return option(None, "torch's threads for this process's math on a CPU (default: every core it may run on; "
                        "moss-serve up: its share of them)", type=positive(int), scope=OWN, show_default=False)


def http_port_option():
    return option(HTTP_PORT, "HTTP port: OpenAI's POST /v1/audio/speech, GET /v1/models, /healthz, /readyz (0: off)",
                  type=int, scope=OWN)


def metrics_port_option(service: str):
    return option(METRICS_PORTS[service], "Prometheus /metrics port (0: off)", type=int, scope=OWN)


def options(cls, scope: str | None = None) -> list[Field]:
    """The options `cls` declares (of one scope, or all), in declaration order."""
    return [f for f in dataclasses.fields(cls) if "scope" in f.metadata and scope in (None, f.metadata["scope"])]


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def default(cls, name: str):
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default if f.default is not MISSING else f.default_factory()


def group_of(cls, name: str) -> str:
    """The --help group of `cls`'s option `name`: the one its GROUPS names it in, else its GROUP."""
    return next((title for title, names in getattr(cls, "GROUPS", {}).items() if name in names),
                getattr(cls, "GROUP", PROCESSES))


def argument_group(parser: argparse.ArgumentParser, title: str):
    """The parser's argument group of this title, made at its first use (argparse would make a second of the same
    title otherwise)."""
    groups = parser.__dict__.setdefault("_moss_groups", {})
    if title not in groups:
        groups[title] = parser.add_argument_group(title)
    return groups[title]


def add_flags(parser, cls, scope: str | None = None) -> None:
    """Each declared option of `cls` (of `scope`, or all) as a flag of `parser`, in its --help group (group_of)."""
    for f in options(cls, scope):
        meta = f.metadata
        help = meta["help"]
        if meta["show_default"] and f.default is not None:
            help += f" (default {f.default})"
        kwargs = dict(default=f.default, help=help.replace("%", "%%"))
        for key in ("type", "choices", "metavar"):
            if meta[key] is not None:
                kwargs[key] = meta[key]
        argument_group(parser, group_of(cls, f.name)).add_argument(flag(f.name), **kwargs)


def from_args(cls, args: argparse.Namespace, **given):
    """A `cls` with every declared option as `args` has it, and the other fields as given."""
    return cls(**{f.name: getattr(args, f.name) for f in options(cls)}, **given)


def forward(args: argparse.Namespace, cls) -> list[str]:
    """The flags that hand `cls`'s FORWARDED options on to a child process as `args` has them (None: the child's
    own default)."""
    flags = []
    for f in options(cls, FORWARDED):
        if (value := getattr(args, f.name)) is not None:
            flags += [flag(f.name), str(value)]
    return flags
