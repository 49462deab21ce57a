from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class AudioFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AUDIO_FORMAT_UNSPECIFIED: _ClassVar[AudioFormat]
    AUDIO_FORMAT_PCM16: _ClassVar[AudioFormat]
    AUDIO_FORMAT_FLOAT32: _ClassVar[AudioFormat]
AUDIO_FORMAT_UNSPECIFIED: AudioFormat
AUDIO_FORMAT_PCM16: AudioFormat
AUDIO_FORMAT_FLOAT32: AudioFormat

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "repetition_penalty", "max_new_tokens", "min_new_tokens", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    max_new_tokens: int
    min_new_tokens: int
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., repetition_penalty: _Optional[float] = ..., max_new_tokens: _Optional[int] = ..., min_new_tokens: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class ChunkPolicy(_message.Message):
    __slots__ = ("first_chunk_tokens", "chunk_tokens", "lookahead_frames", "second_chunk_tokens", "playback_speed")
    FIRST_CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOOKAHEAD_FRAMES_FIELD_NUMBER: _ClassVar[int]
    SECOND_CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PLAYBACK_SPEED_FIELD_NUMBER: _ClassVar[int]
    first_chunk_tokens: int
    chunk_tokens: int
    lookahead_frames: int
    second_chunk_tokens: int
    playback_speed: float
    def __init__(self, first_chunk_tokens: _Optional[int] = ..., chunk_tokens: _Optional[int] = ..., lookahead_frames: _Optional[int] = ..., second_chunk_tokens: _Optional[int] = ..., playback_speed: _Optional[float] = ...) -> None: ...
