from moss.speech.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplyModality(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLY_MODALITY_UNSPECIFIED: _ClassVar[ReplyModality]
    REPLY_MODALITY_SPEECH: _ClassVar[ReplyModality]
    REPLY_MODALITY_TEXT: _ClassVar[ReplyModality]

class SessionEndReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_END_REASON_UNSPECIFIED: _ClassVar[SessionEndReason]
    SESSION_END_REASON_CLOSED: _ClassVar[SessionEndReason]
    SESSION_END_REASON_CLIENT_DONE: _ClassVar[SessionEndReason]
    SESSION_END_REASON_IDLE: _ClassVar[SessionEndReason]
REPLY_MODALITY_UNSPECIFIED: ReplyModality
REPLY_MODALITY_SPEECH: ReplyModality
REPLY_MODALITY_TEXT: ReplyModality
SESSION_END_REASON_UNSPECIFIED: SessionEndReason
SESSION_END_REASON_CLOSED: SessionEndReason
SESSION_END_REASON_CLIENT_DONE: SessionEndReason
SESSION_END_REASON_IDLE: SessionEndReason

class VoiceConfig(_message.Message):
    __slots__ = ("name", "sample_rate", "format")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    name: str
    sample_rate: int
    format: _common_pb2.AudioFormat
    def __init__(self, name: _Optional[str] = ..., sample_rate: _Optional[int] = ..., format: _Optional[_Union[_common_pb2.AudioFormat, str]] = ...) -> None: ...

class CreateVoiceRequest(_message.Message):
    __slots__ = ("config", "audio")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    config: VoiceConfig
    audio: bytes
    def __init__(self, config: _Optional[_Union[VoiceConfig, _Mapping]] = ..., audio: _Optional[bytes] = ...) -> None: ...

class VoiceInfo(_message.Message):
    __slots__ = ("name", "own", "prompt_seconds", "fast", "kept")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWN_FIELD_NUMBER: _ClassVar[int]
    PROMPT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FAST_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    name: str
    own: bool
    prompt_seconds: float
    fast: bool
    kept: bool
    def __init__(self, name: _Optional[str] = ..., own: _Optional[bool] = ..., prompt_seconds: _Optional[float] = ..., fast: _Optional[bool] = ..., kept: _Optional[bool] = ...) -> None: ...

class VoiceListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VoiceList(_message.Message):
    __slots__ = ("voices",)
    VOICES_FIELD_NUMBER: _ClassVar[int]
    voices: _containers.RepeatedCompositeFieldContainer[VoiceInfo]
    def __init__(self, voices: _Optional[_Iterable[_Union[VoiceInfo, _Mapping]]] = ...) -> None: ...

class DeleteVoiceRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteVoiceResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SessionConfig(_message.Message):
    __slots__ = ("voice", "system_prompt", "sampling", "format", "chunking")
    VOICE_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    CHUNKING_FIELD_NUMBER: _ClassVar[int]
    voice: str
    system_prompt: str
    sampling: _common_pb2.SamplingParams
    format: _common_pb2.AudioFormat
    chunking: _common_pb2.ChunkPolicy
    def __init__(self, voice: _Optional[str] = ..., system_prompt: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., format: _Optional[_Union[_common_pb2.AudioFormat, str]] = ..., chunking: _Optional[_Union[_common_pb2.ChunkPolicy, _Mapping]] = ...) -> None: ...

class UserTurn(_message.Message):
    __slots__ = ("text", "sampling", "reply")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    text: str
    sampling: _common_pb2.SamplingParams
    reply: ReplyModality
    def __init__(self, text: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., reply: _Optional[_Union[ReplyModality, str]] = ...) -> None: ...

class SpeechInput(_message.Message):
    __slots__ = ("sample_rate", "format", "detect_speech", "end_silence_seconds", "sampling", "reply")
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DETECT_SPEECH_FIELD_NUMBER: _ClassVar[int]
    END_SILENCE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    sample_rate: int
    format: _common_pb2.AudioFormat
    detect_speech: bool
    end_silence_seconds: float
    sampling: _common_pb2.SamplingParams
    reply: ReplyModality
    def __init__(self, sample_rate: _Optional[int] = ..., format: _Optional[_Union[_common_pb2.AudioFormat, str]] = ..., detect_speech: _Optional[bool] = ..., end_silence_seconds: _Optional[float] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., reply: _Optional[_Union[ReplyModality, str]] = ...) -> None: ...

class UserAudio(_message.Message):
    __slots__ = ("pcm",)
    PCM_FIELD_NUMBER: _ClassVar[int]
    pcm: bytes
    def __init__(self, pcm: _Optional[bytes] = ...) -> None: ...

class EndOfSpeech(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CancelTurn(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CloseSession(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ConverseRequest(_message.Message):
    __slots__ = ("config", "turn", "cancel", "close", "speech", "audio", "end_of_speech")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    SPEECH_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    END_OF_SPEECH_FIELD_NUMBER: _ClassVar[int]
    config: SessionConfig
    turn: UserTurn
    cancel: CancelTurn
    close: CloseSession
    speech: SpeechInput
    audio: UserAudio
    end_of_speech: EndOfSpeech
    def __init__(self, config: _Optional[_Union[SessionConfig, _Mapping]] = ..., turn: _Optional[_Union[UserTurn, _Mapping]] = ..., cancel: _Optional[_Union[CancelTurn, _Mapping]] = ..., close: _Optional[_Union[CloseSession, _Mapping]] = ..., speech: _Optional[_Union[SpeechInput, _Mapping]] = ..., audio: _Optional[_Union[UserAudio, _Mapping]] = ..., end_of_speech: _Optional[_Union[EndOfSpeech, _Mapping]] = ...) -> None: ...

class SessionStarted(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class TextPiece(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class UserSpeechStarted(_message.Message):
    __slots__ = ("audio_seconds",)
    AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    audio_seconds: float
    def __init__(self, audio_seconds: _Optional[float] = ...) -> None: ...

class UserSpeechEnded(_message.Message):
    __slots__ = ("audio_seconds", "codes")
    AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CODES_FIELD_NUMBER: _ClassVar[int]
    audio_seconds: float
    codes: int
    def __init__(self, audio_seconds: _Optional[float] = ..., codes: _Optional[int] = ...) -> None: ...

class TurnCancelled(_message.Message):
    __slots__ = ("seconds",)
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    seconds: float
    def __init__(self, seconds: _Optional[float] = ...) -> None: ...

class TurnFailed(_message.Message):
    __slots__ = ("code", "message", "retry_after_seconds")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    retry_after_seconds: float
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., retry_after_seconds: _Optional[float] = ...) -> None: ...

class SessionEnded(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: SessionEndReason
    def __init__(self, reason: _Optional[_Union[SessionEndReason, str]] = ...) -> None: ...

class ConverseResponse(_message.Message):
    __slots__ = ("turn", "session", "metadata", "audio", "text", "summary", "cancelled", "ended", "failed", "speech_started", "speech_ended")
    TURN_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    SPEECH_STARTED_FIELD_NUMBER: _ClassVar[int]
    SPEECH_ENDED_FIELD_NUMBER: _ClassVar[int]
    turn: int
    session: SessionStarted
    metadata: StreamMetadata
    audio: AudioChunk
    text: TextPiece
    summary: SynthesisSummary
    cancelled: TurnCancelled
    ended: SessionEnded
    failed: TurnFailed
    speech_started: UserSpeechStarted
    speech_ended: UserSpeechEnded
    def __init__(self, turn: _Optional[int] = ..., session: _Optional[_Union[SessionStarted, _Mapping]] = ..., metadata: _Optional[_Union[StreamMetadata, _Mapping]] = ..., audio: _Optional[_Union[AudioChunk, _Mapping]] = ..., text: _Optional[_Union[TextPiece, _Mapping]] = ..., summary: _Optional[_Union[SynthesisSummary, _Mapping]] = ..., cancelled: _Optional[_Union[TurnCancelled, _Mapping]] = ..., ended: _Optional[_Union[SessionEnded, _Mapping]] = ..., failed: _Optional[_Union[TurnFailed, _Mapping]] = ..., speech_started: _Optional[_Union[UserSpeechStarted, _Mapping]] = ..., speech_ended: _Optional[_Union[UserSpeechEnded, _Mapping]] = ...) -> None: ...

class SynthesizeRequest(_message.Message):
    __slots__ = ("text", "voice", "sampling", "format", "chunking")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    CHUNKING_FIELD_NUMBER: _ClassVar[int]
    text: str
    voice: str
    sampling: _common_pb2.SamplingParams
    format: _common_pb2.AudioFormat
    chunking: _common_pb2.ChunkPolicy
    def __init__(self, text: _Optional[str] = ..., voice: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., format: _Optional[_Union[_common_pb2.AudioFormat, str]] = ..., chunking: _Optional[_Union[_common_pb2.ChunkPolicy, _Mapping]] = ...) -> None: ...

class StreamMetadata(_message.Message):
    __slots__ = ("request_id", "sample_rate", "format", "channels")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    sample_rate: int
    format: _common_pb2.AudioFormat
    channels: int
    def __init__(self, request_id: _Optional[str] = ..., sample_rate: _Optional[int] = ..., format: _Optional[_Union[_common_pb2.AudioFormat, str]] = ..., channels: _Optional[int] = ...) -> None: ...

class AudioChunk(_message.Message):
    __slots__ = ("pcm", "sample_offset", "num_samples")
    PCM_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    pcm: bytes
    sample_offset: int
    num_samples: int
    def __init__(self, pcm: _Optional[bytes] = ..., sample_offset: _Optional[int] = ..., num_samples: _Optional[int] = ...) -> None: ...

class SynthesisSummary(_message.Message):
    __slots__ = ("ttfa_seconds", "total_seconds", "llm_queue_seconds", "llm_prefill_seconds", "llm_decode_seconds", "llm_first_chunk_seconds", "vocoder_compute_seconds", "vocoder_first_chunk_seconds", "audio_tokens", "num_samples", "audio_seconds", "real_time_factor", "prompt_tokens", "speech_end_to_first_audio_seconds", "encoder_finish_seconds", "user_codes", "user_audio_seconds", "llm_first_chunk_in_llm_seconds", "vocoder_first_chunk_in_vocoder_seconds", "vocoder_first_chunk_queue_seconds", "admission_wait_seconds", "second_chunk_slack_seconds", "llm_second_chunk_seconds", "vocoder_second_chunk_in_vocoder_seconds", "vocoder_second_chunk_queue_seconds")
    TTFA_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LLM_QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LLM_PREFILL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LLM_DECODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LLM_FIRST_CHUNK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    VOCODER_COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    VOCODER_FIRST_CHUNK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    AUDIO_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REAL_TIME_FACTOR_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPEECH_END_TO_FIRST_AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ENCODER_FINISH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    USER_CODES_FIELD_NUMBER: _ClassVar[int]
    USER_AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LLM_FIRST_CHUNK_IN_LLM_SECONDS_FIELD_NUMBER: _ClassVar[int]
    VOCODER_FIRST_CHUNK_IN_VOCODER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    VOCODER_FIRST_CHUNK_QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SECOND_CHUNK_SLACK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LLM_SECOND_CHUNK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    VOCODER_SECOND_CHUNK_IN_VOCODER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    VOCODER_SECOND_CHUNK_QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ttfa_seconds: float
    total_seconds: float
    llm_queue_seconds: float
    llm_prefill_seconds: float
    llm_decode_seconds: float
    llm_first_chunk_seconds: float
    vocoder_compute_seconds: float
    vocoder_first_chunk_seconds: float
    audio_tokens: int
    num_samples: int
    audio_seconds: float
    real_time_factor: float
    prompt_tokens: int
    speech_end_to_first_audio_seconds: float
    encoder_finish_seconds: float
    user_codes: int
    user_audio_seconds: float
    llm_first_chunk_in_llm_seconds: float
    vocoder_first_chunk_in_vocoder_seconds: float
    vocoder_first_chunk_queue_seconds: float
    admission_wait_seconds: float
    second_chunk_slack_seconds: float
    llm_second_chunk_seconds: float
    vocoder_second_chunk_in_vocoder_seconds: float
    vocoder_second_chunk_queue_seconds: float
    def __init__(self, ttfa_seconds: _Optional[float] = ..., total_seconds: _Optional[float] = ..., llm_queue_seconds: _Optional[float] = ..., llm_prefill_seconds: _Optional[float] = ..., llm_decode_seconds: _Optional[float] = ..., llm_first_chunk_seconds: _Optional[float] = ..., vocoder_compute_seconds: _Optional[float] = ..., vocoder_first_chunk_seconds: _Optional[float] = ..., audio_tokens: _Optional[int] = ..., num_samples: _Optional[int] = ..., audio_seconds: _Optional[float] = ..., real_time_factor: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., speech_end_to_first_audio_seconds: _Optional[float] = ..., encoder_finish_seconds: _Optional[float] = ..., user_codes: _Optional[int] = ..., user_audio_seconds: _Optional[float] = ..., llm_first_chunk_in_llm_seconds: _Optional[float] = ..., vocoder_first_chunk_in_vocoder_seconds: _Optional[float] = ..., vocoder_first_chunk_queue_seconds: _Optional[float] = ..., admission_wait_seconds: _Optional[float] = ..., second_chunk_slack_seconds: _Optional[float] = ..., llm_second_chunk_seconds: _Optional[float] = ..., vocoder_second_chunk_in_vocoder_seconds: _Optional[float] = ..., vocoder_second_chunk_queue_seconds: _Optional[float] = ...) -> None: ...

class SynthesizeResponse(_message.Message):
    __slots__ = ("metadata", "audio", "summary")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    metadata: StreamMetadata
    audio: AudioChunk
    summary: SynthesisSummary
    def __init__(self, metadata: _Optional[_Union[StreamMetadata, _Mapping]] = ..., audio: _Optional[_Union[AudioChunk, _Mapping]] = ..., summary: _Optional[_Union[SynthesisSummary, _Mapping]] = ...) -> None: ...
