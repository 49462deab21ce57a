from moss.speech.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EncodeConfig(_message.Message):
    __slots__ = ("sample_rate", "format", "detect_speech", "end_silence_seconds")
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DETECT_SPEECH_FIELD_NUMBER: _ClassVar[int]
    END_SILENCE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    sample_rate: int
    format: _common_pb2.AudioFormat
    detect_speech: bool
    end_silence_seconds: float
    def __init__(self, sample_rate: _Optional[int] = ..., format: _Optional[_Union[_common_pb2.AudioFormat, str]] = ..., detect_speech: _Optional[bool] = ..., end_silence_seconds: _Optional[float] = ...) -> None: ...

class AudioData(_message.Message):
    __slots__ = ("pcm",)
    PCM_FIELD_NUMBER: _ClassVar[int]
    pcm: bytes
    def __init__(self, pcm: _Optional[bytes] = ...) -> None: ...

class EndOfTurn(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EncodeRequest(_message.Message):
    __slots__ = ("config", "audio", "end")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    config: EncodeConfig
    audio: AudioData
    end: EndOfTurn
    def __init__(self, config: _Optional[_Union[EncodeConfig, _Mapping]] = ..., audio: _Optional[_Union[AudioData, _Mapping]] = ..., end: _Optional[_Union[EndOfTurn, _Mapping]] = ...) -> None: ...

class SpeechStarted(_message.Message):
    __slots__ = ("audio_seconds",)
    AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    audio_seconds: float
    def __init__(self, audio_seconds: _Optional[float] = ...) -> None: ...

class SpeechEnded(_message.Message):
    __slots__ = ("audio_seconds",)
    AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    audio_seconds: float
    def __init__(self, audio_seconds: _Optional[float] = ...) -> None: ...

class EncodedTurn(_message.Message):
    __slots__ = ("codes", "audio_seconds", "finish_seconds", "speech_detected", "reencoded_segments")
    CODES_FIELD_NUMBER: _ClassVar[int]
    AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SPEECH_DETECTED_FIELD_NUMBER: _ClassVar[int]
    REENCODED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    codes: _containers.RepeatedScalarFieldContainer[int]
    audio_seconds: float
    finish_seconds: float
    speech_detected: bool
    reencoded_segments: int
    def __init__(self, codes: _Optional[_Iterable[int]] = ..., audio_seconds: _Optional[float] = ..., finish_seconds: _Optional[float] = ..., speech_detected: _Optional[bool] = ..., reencoded_segments: _Optional[int] = ...) -> None: ...

class EncodeRefused(_message.Message):
    __slots__ = ("code", "message", "retry_after_seconds")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    retry_after_seconds: float
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., retry_after_seconds: _Optional[float] = ...) -> None: ...

class EncodeResponse(_message.Message):
    __slots__ = ("started", "ended", "turn", "refused")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    started: SpeechStarted
    ended: SpeechEnded
    turn: EncodedTurn
    refused: EncodeRefused
    def __init__(self, started: _Optional[_Union[SpeechStarted, _Mapping]] = ..., ended: _Optional[_Union[SpeechEnded, _Mapping]] = ..., turn: _Optional[_Union[EncodedTurn, _Mapping]] = ..., refused: _Optional[_Union[EncodeRefused, _Mapping]] = ...) -> None: ...
