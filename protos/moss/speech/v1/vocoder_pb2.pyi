from moss.speech.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RemoveVoiceRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RemoveVoiceResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AddVoiceRequest(_message.Message):
    __slots__ = ("name", "prompt_tokens", "prompt_mel", "embedding", "recording", "recording_rate")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_MEL_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    RECORDING_FIELD_NUMBER: _ClassVar[int]
    RECORDING_RATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    prompt_mel: bytes
    embedding: _containers.RepeatedScalarFieldContainer[float]
    recording: bytes
    recording_rate: int
    def __init__(self, name: _Optional[str] = ..., prompt_tokens: _Optional[_Iterable[int]] = ..., prompt_mel: _Optional[bytes] = ..., embedding: _Optional[_Iterable[float]] = ..., recording: _Optional[bytes] = ..., recording_rate: _Optional[int] = ...) -> None: ...

class AddVoiceResponse(_message.Message):
    __slots__ = ("fast", "kept")
    FAST_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    fast: bool
    kept: bool
    def __init__(self, fast: _Optional[bool] = ..., kept: _Optional[bool] = ...) -> None: ...

class ListVoicesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListVoicesResponse(_message.Message):
    __slots__ = ("voices", "stream_slots", "max_prompt_seconds", "max_voices")
    VOICES_FIELD_NUMBER: _ClassVar[int]
    STREAM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_VOICES_FIELD_NUMBER: _ClassVar[int]
    voices: _containers.RepeatedScalarFieldContainer[str]
    stream_slots: int
    max_prompt_seconds: float
    max_voices: int
    def __init__(self, voices: _Optional[_Iterable[str]] = ..., stream_slots: _Optional[int] = ..., max_prompt_seconds: _Optional[float] = ..., max_voices: _Optional[int] = ...) -> None: ...

class VocodeConfig(_message.Message):
    __slots__ = ("request_id", "format", "lookahead_frames", "voice", "playback_speed")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    LOOKAHEAD_FRAMES_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    PLAYBACK_SPEED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    format: _common_pb2.AudioFormat
    lookahead_frames: int
    voice: str
    playback_speed: float
    def __init__(self, request_id: _Optional[str] = ..., format: _Optional[_Union[_common_pb2.AudioFormat, str]] = ..., lookahead_frames: _Optional[int] = ..., voice: _Optional[str] = ..., playback_speed: _Optional[float] = ...) -> None: ...

class AudioTokens(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class EndOfTokens(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VocodeRequest(_message.Message):
    __slots__ = ("config", "tokens", "end")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    config: VocodeConfig
    tokens: AudioTokens
    end: EndOfTokens
    def __init__(self, config: _Optional[_Union[VocodeConfig, _Mapping]] = ..., tokens: _Optional[_Union[AudioTokens, _Mapping]] = ..., end: _Optional[_Union[EndOfTokens, _Mapping]] = ...) -> None: ...

class VocodeStats(_message.Message):
    __slots__ = ("chunks", "tokens", "compute_seconds", "first_chunk_compute_seconds", "queue_seconds", "first_chunk_queue_seconds", "first_chunk_seconds", "second_chunk_queue_seconds", "second_chunk_compute_seconds", "second_chunk_seconds")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_CHUNK_COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_CHUNK_QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_CHUNK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SECOND_CHUNK_QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SECOND_CHUNK_COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SECOND_CHUNK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    chunks: int
    tokens: int
    compute_seconds: float
    first_chunk_compute_seconds: float
    queue_seconds: float
    first_chunk_queue_seconds: float
    first_chunk_seconds: float
    second_chunk_queue_seconds: float
    second_chunk_compute_seconds: float
    second_chunk_seconds: float
    def __init__(self, chunks: _Optional[int] = ..., tokens: _Optional[int] = ..., compute_seconds: _Optional[float] = ..., first_chunk_compute_seconds: _Optional[float] = ..., queue_seconds: _Optional[float] = ..., first_chunk_queue_seconds: _Optional[float] = ..., first_chunk_seconds: _Optional[float] = ..., second_chunk_queue_seconds: _Optional[float] = ..., second_chunk_compute_seconds: _Optional[float] = ..., second_chunk_seconds: _Optional[float] = ...) -> None: ...

class VocodeResponse(_message.Message):
    __slots__ = ("pcm", "sample_offset", "num_samples", "sample_rate", "format", "final", "stats")
    PCM_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    pcm: bytes
    sample_offset: int
    num_samples: int
    sample_rate: int
    format: _common_pb2.AudioFormat
    final: bool
    stats: VocodeStats
    def __init__(self, pcm: _Optional[bytes] = ..., sample_offset: _Optional[int] = ..., num_samples: _Optional[int] = ..., sample_rate: _Optional[int] = ..., format: _Optional[_Union[_common_pb2.AudioFormat, str]] = ..., final: _Optional[bool] = ..., stats: _Optional[_Union[VocodeStats, _Mapping]] = ...) -> None: ...
