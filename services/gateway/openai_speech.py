"""OpenAI's `POST /v1/audio/speech` body → the turn it asks for and how its audio goes back.

Fields (https://platform.openai.com/docs/api-reference/audio/createSpeech):
- model: "moss-speech" (GET /v1/models), or one of OpenAI's speech models' names, so that code written for
  OpenAI works unchanged; anything else: 404, as OpenAI answers a model it does not have.
- input: the text, 1 to --max-text-chars characters.
- voice: a voice the vocoder has (its voice files; "default"); OpenAI's voice names speak in the default voice.
  Unknown: 400 listing the known ones.
- response_format: pcm, wav, flac, mp3 (OpenAI's default), opus or aac (audio_encoding.py).
- speed: 0.25-4.0, default 1.0: the reply time-stretched at the same pitch as it streams (time_stretch.py); the
  stall clock and the llm's pacing are told (ChunkPolicy.playback_speed).
- stream_format: "audio" (the encoded stream's bytes as they are made) or "sse" (server-sent events:
  speech.audio.delta with base64 audio, then speech.audio.done with usage).
- instructions (OpenAI's steering of a voice): not supported; refused when given, rather than ignored.
- sampling (ours; the SDK sends it as `extra_body={"sampling": {...}}`): moss.speech.v1.SamplingParams in its JSON
  form (temperature, top_p, top_k, repetition_penalty, max_new_tokens, min_new_tokens, seed), as a gRPC client
  sets it; unset fields keep the service defaults.
Any other field is refused by name (a typo would otherwise pass unnoticed).
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import json_format
from moss.speech.v1 import common_pb2, gateway_pb2

from services.common.errors import InvalidArgument, NotFound, echo
from services.common.sampling import PLAYBACK_SPEEDS
from services.gateway.audio_encoding import check_format
from services.gateway.turn_request import TurnLimits, validate_text

MODEL = "moss-speech"
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
OPENAI_VOICES = ("alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage",
                 "shimmer", "verse")
FIELDS = ("model", "input", "voice", "response_format", "speed", "stream_format", "instructions", "sampling")
STREAM_FORMATS = ("audio", "sse")
DEFAULT_FORMAT = "mp3"  # OpenAI's


@dataclass(frozen=True)
class SpeechRequest:
    synthesize: gateway_pb2.SynthesizeRequest
    response_format: str  # audio_encoding.FORMATS
    stream_format: str    # STREAM_FORMATS
    speed: float          # PLAYBACK_SPEEDS


def _string(body: dict, name: str, default: str | None = None) -> str:
    """A string field; `default` where it is absent or null (clients that send every field of OpenAI's schema send
    null for the ones not set), and required where there is none."""
    value = body.get(name)
    if value is None:
        if default is None:
            raise InvalidArgument(name, "required")
        value = default
    if not isinstance(value, str):
        raise InvalidArgument(name, f"must be a string, not {type(value).__name__}")
    try:
        value.encode()  # JSON's \ud800 escapes make strings no protobuf message takes
    except UnicodeEncodeError as exc:
        raise InvalidArgument(name, f"not Unicode: an unpaired surrogate at character {exc.start}") from None
    return value


def parse_speech(body: object, limits: TurnLimits) -> SpeechRequest:
    """Everything a client can get wrong in the body is refused here (InvalidArgument naming the field, or
    NotFound for the model), before admission or any stage."""
    if not isinstance(body, dict):
        raise InvalidArgument("body", "must be a JSON object")
    for name in body:
        if name not in FIELDS:
            raise InvalidArgument(name, f"unknown field; this endpoint takes {', '.join(FIELDS)}")
    model = _string(body, "model")
    if model not in (MODEL, *OPENAI_MODELS):
        raise NotFound("model", f"the model {echo(model)} is not served here; use {MODEL!r} (GET /v1/models)")
    text = _string(body, "input")
    validate_text(text, limits, field="input")
    voice = _string(body, "voice")
    response_format = check_format(_string(body, "response_format", DEFAULT_FORMAT))
    speed = 1.0 if body.get("speed") is None else body["speed"]
    if isinstance(speed, bool) or not isinstance(speed, int | float):
        raise InvalidArgument("speed", f"must be a number, not {type(speed).__name__}")
    if not PLAYBACK_SPEEDS[0] <= speed <= PLAYBACK_SPEEDS[1]:
        raise InvalidArgument("speed", f"{speed} is outside {PLAYBACK_SPEEDS[0]}-{PLAYBACK_SPEEDS[1]}")
    stream_format = _string(body, "stream_format", "audio")
    if stream_format not in STREAM_FORMATS:
        raise InvalidArgument("stream_format", f"{echo(stream_format)}: use one of {', '.join(STREAM_FORMATS)}")
    if _string(body, "instructions", ""):
        raise InvalidArgument("instructions", "not supported: the voice is chosen by `voice` alone")
    request = gateway_pb2.SynthesizeRequest(text=text, voice="" if voice in OPENAI_VOICES else voice,
                                            format=common_pb2.AUDIO_FORMAT_PCM16)
    if body.get("sampling") is not None:  # its values are checked with the turn's (pipeline.validate), as gRPC's are
        if not isinstance(body["sampling"], dict):
            raise InvalidArgument("sampling", "must be an object of SamplingParams fields")
        try:
            json_format.ParseDict(body["sampling"], request.sampling)
        except json_format.ParseError as exc:
            raise InvalidArgument("sampling", str(exc)) from None
    if speed != 1.0:
        request.chunking.playback_speed = float(speed)
    return SpeechRequest(request, response_format, stream_format, float(speed))


def usage(summary: gateway_pb2.SynthesisSummary) -> dict:
    """speech.audio.done's usage: the prompt's tokens in, the reply's audio tokens out."""
    return {"input_tokens": summary.prompt_tokens, "output_tokens": summary.audio_tokens,
            "total_tokens": summary.prompt_tokens + summary.audio_tokens}
