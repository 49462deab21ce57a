from moss.speech.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OutputMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTPUT_MODE_UNSPECIFIED: _ClassVar[OutputMode]
    OUTPUT_MODE_AUDIO: _ClassVar[OutputMode]
    OUTPUT_MODE_TEXT: _ClassVar[OutputMode]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_END_OF_SPEECH: _ClassVar[FinishReason]
OUTPUT_MODE_UNSPECIFIED: OutputMode
OUTPUT_MODE_AUDIO: OutputMode
OUTPUT_MODE_TEXT: OutputMode
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_END_OF_SPEECH: FinishReason

class HoldRequest(_message.Message):
    __slots__ = ("request_id", "held")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    held: bool
    def __init__(self, request_id: _Optional[str] = ..., held: _Optional[bool] = ...) -> None: ...

class HoldResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class ReleaseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ReleaseSessionResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class PromptTokens(_message.Message):
    __slots__ = ("text", "audio")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    text: _containers.RepeatedScalarFieldContainer[int]
    audio: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, text: _Optional[_Iterable[int]] = ..., audio: _Optional[_Iterable[int]] = ...) -> None: ...

class SpokenTurn(_message.Message):
    __slots__ = ("codes",)
    CODES_FIELD_NUMBER: _ClassVar[int]
    codes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, codes: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "session_id", "text", "audio", "tokens", "system_prompt", "sampling", "chunking", "output_mode", "history")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CHUNKING_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_MODE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    session_id: str
    text: str
    audio: SpokenTurn
    tokens: PromptTokens
    system_prompt: str
    sampling: _common_pb2.SamplingParams
    chunking: _common_pb2.ChunkPolicy
    output_mode: OutputMode
    history: PromptTokens
    def __init__(self, request_id: _Optional[str] = ..., session_id: _Optional[str] = ..., text: _Optional[str] = ..., audio: _Optional[_Union[SpokenTurn, _Mapping]] = ..., tokens: _Optional[_Union[PromptTokens, _Mapping]] = ..., system_prompt: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., chunking: _Optional[_Union[_common_pb2.ChunkPolicy, _Mapping]] = ..., output_mode: _Optional[_Union[OutputMode, str]] = ..., history: _Optional[_Union[PromptTokens, _Mapping]] = ...) -> None: ...

class GenerationStats(_message.Message):
    __slots__ = ("prompt_tokens", "generated_tokens", "audio_tokens", "text_tokens", "queue_seconds", "prefill_seconds", "decode_seconds", "first_audio_token_seconds", "finish_reason")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    AUDIO_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DECODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_AUDIO_TOKEN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    generated_tokens: int
    audio_tokens: int
    text_tokens: int
    queue_seconds: float
    prefill_seconds: float
    decode_seconds: float
    first_audio_token_seconds: float
    finish_reason: FinishReason
    def __init__(self, prompt_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., audio_tokens: _Optional[int] = ..., text_tokens: _Optional[int] = ..., queue_seconds: _Optional[float] = ..., prefill_seconds: _Optional[float] = ..., decode_seconds: _Optional[float] = ..., first_audio_token_seconds: _Optional[float] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("index", "first", "final", "audio_tokens", "text_tokens", "stats", "text", "turn_tokens", "since_arrival_seconds")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    AUDIO_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TURN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SINCE_ARRIVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    index: int
    first: bool
    final: bool
    audio_tokens: _containers.RepeatedScalarFieldContainer[int]
    text_tokens: _containers.RepeatedScalarFieldContainer[int]
    stats: GenerationStats
    text: str
    turn_tokens: PromptTokens
    since_arrival_seconds: float
    def __init__(self, index: _Optional[int] = ..., first: _Optional[bool] = ..., final: _Optional[bool] = ..., audio_tokens: _Optional[_Iterable[int]] = ..., text_tokens: _Optional[_Iterable[int]] = ..., stats: _Optional[_Union[GenerationStats, _Mapping]] = ..., text: _Optional[str] = ..., turn_tokens: _Optional[_Union[PromptTokens, _Mapping]] = ..., since_arrival_seconds: _Optional[float] = ...) -> None: ...
