"""The encoder service's settings, each option declared once (services/settings.py): `moss-serve encoder` takes them
all, `moss-serve up` the FORWARDED ones, which it hands on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from services.settings import (
    ENCODER,
    GPU_STACK_STREAMS,
    OWN,
    PROCESSES,
    cpu_threads_option,
    host_option,
    metrics_port_option,
    option,
    port_option,
    positive,
    seconds,
)

if TYPE_CHECKING:  # (grpc's: not imported for `moss-serve --help`)
    from services.common.tls import ServerTls

PRESETS = ("tiny", "moss-speech")  # services/encoder/config.py's tiny() and glm4_voice() (not imported: torch)


def probability(text: str) -> float:
    value = positive(float)(text)
    if value >= 1:
        raise ValueError(f"must be under 1, got {text}")
    return value


DEFAULT_SPEAKERS = 32  # on a CPU
GPU_DEFAULT_SPEAKERS = GPU_STACK_STREAMS  # on a GPU: a place for every stream the stack plays (services/settings.py)


def default_speakers(device: str) -> int:
    """The speakers' places when --max-speakers is not given (at most what half the free memory holds: memory.py)."""
    return GPU_DEFAULT_SPEAKERS if device.startswith("cuda") else DEFAULT_SPEAKERS


@dataclass
class EncoderSettings:
    GROUP: ClassVar[str] = ENCODER
    GROUPS: ClassVar[dict[str, tuple[str, ...]]] = {PROCESSES: ("host", "port", "metrics_port", "device", "cpu_threads")}

    host: str = host_option()
    port: int = port_option("encoder")
    metrics_port: int = metrics_port_option("encoder")
    encoder_dir: str | None = option(None, "the speech tokenizer's directory (config.json, model*.safetensors: "
                                           "GLM-4-Voice's glm-4-voice-tokenizer layout); without it: the --preset with "
                                           "random weights", scope=OWN)
    preset: str = option("tiny", "moss-speech: the Whisper-VQ encoder at its real size (16 layers of 1280); tiny: a "
                                 "small one", choices=PRESETS, scope=OWN)
    device: str = option("cpu", "cpu or cuda", scope=OWN)
    cpu_threads: int | None = cpu_threads_option()
    max_speakers: int | None = option(None, f"speakers encoded at once (each holds 30 s of keys and values: 123 MB "
                                            f"at the real size in bf16, twice that in float32); a turn whose speech "
                                            f"starts when all are taken: RESOURCE_EXHAUSTED (default: "
                                            f"{DEFAULT_SPEAKERS} on a CPU, {GPU_DEFAULT_SPEAKERS} on a GPU, or as many "
                                            f"as fit in half the device's free memory; "
                                            f"given, they must fit or the encoder refuses to start)",
                                      type=positive(int), show_default=False)
    max_listeners: int = option(256, "Encode calls open at once, those still listening for speech included; more: "
                                 "RESOURCE_EXHAUSTED", type=positive(int))
    speakers_per_call: int = option(64, "speakers whose new audio is encoded in one model call", type=positive(int))
    max_turn_seconds: float = option(60.0, "longest spoken turn taken (with detection: of speech; the speech ends "
                                           "there)", type=positive(float))
    end_silence_seconds: float = option(0.5, "with speech detection: silence that ends a speaker's turn, unless the "
                                             "call asks for its own", type=positive(float))
    speech_threshold: float = option(0.5, "with speech detection: a 32 ms window's voice-activity probability (Silero "
                                          "VAD) from which it is speech", type=probability)
    speech_pad_seconds: float = option(0.1, "with speech detection: audio encoded either side of the speech",
                                       type=seconds)
    cuda_graphs: str = option("on", "on CUDA: the encoder's layers replayed from CUDA graphs, one per bucket of a "
                                     "call's frames (off: launched op by op; docs/encoder.md)", choices=["on", "off"],
                              scope=OWN)
    seed: int = 0
    tls: ServerTls | None = None  # TLS on the gRPC port (mutual with a client CA: only the gateway gets in)
