"""Voices made, listed and deleted through the API (every door: gRPC's CreateVoice, ListVoices and DeleteVoice;
HTTP's /v1/audio/voices). The work is the stack's own:

    recording ──checked, and cut to the longest prompt at a pause (services/common/recording.py)──▶
              encoder: Encode → its codes
              ──codes + recording──▶ every vocoder replica: AddVoice (the mel and x-vector made there, as
                                     `moss-serve voice` makes them; the voice kept in its voices directory)

A voice goes to every vocoder replica or to none: a replica not ready refuses it before any work (UNAVAILABLE),
and one that fails it has the replicas that took it remove it again. The gateway then knows the name at once (each
replica's voices, backends.py) and records its owner (voice_owners.py): the calling key's, or everyone's without
keys. Making a voice holds one of the encoder's speaker places for the recording's encoding, and the vocoder's
device for ~0.3 s (capture.exclusive), beside the streams playing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import grpc
import numpy as np
from moss.speech.v1 import common_pb2, encoder_pb2, gateway_pb2, vocoder_pb2

from services.common.audio import BYTES_PER_SAMPLE, decode_pcm, read_audio_bytes
from services.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    ServiceError,
    Unavailable,
    echo,
)
from services.common.recording import (
    LONGEST_RECORDING,
    MIN_VOICE_SECONDS,
    NAME,
    NAME_RULE,
    RecordingError,
    check_recording,
    prompt_cut,
)
from services.gateway import metrics
from services.gateway.backends import Backends, Replica
from services.gateway.listener import refusal
from services.gateway.pipeline import stage_error
from services.gateway.voice_owners import SHARED, VoiceOwners
from services.gateway.voices import DEFAULT

log = logging.getLogger(__name__)

SECONDS_PER_CODE = 0.08   # the encoder's codes: 12.5 a second
CHUNK_BYTES = 64 << 10    # the recording's pieces to the encoder
DEFAULT_MAX_PER_KEY = 8   # --max-voices-per-key's default
MAX_MAKING = 4            # voices made at once, all keys together
MAKING_RETRY_SECONDS = 1.0  # the hint of a refusal for those: a voice takes ~0.2-1 s


@dataclass
class Recording:
    """A recording as the doors take it in: float samples (mono) at `rate`, and the 16-bit PCM the stages get."""

    samples: np.ndarray  # [n] float32 in [-1, 1]
    rate: int

    @property
    def pcm16(self) -> bytes:
        return (np.clip(np.round(self.samples * 32768), -32768, 32767)).astype("<i2").tobytes()


def recording_of_pcm(pcm: bytes, rate: int, fmt: int, field: str = "audio") -> Recording:
    """A recording sent as PCM (gRPC's CreateVoice) → Recording; InvalidArgument naming `field` for bytes that are
    not whole samples or a sample that is not a number."""
    width = BYTES_PER_SAMPLE[fmt]
    if len(pcm) % width:
        raise InvalidArgument(field, f"{len(pcm)} bytes are not whole samples of {width} bytes")
    samples = decode_pcm(pcm, fmt) if fmt != common_pb2.AUDIO_FORMAT_PCM16 else \
        np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768  # (exactly as the vocoder reads it)
    if not np.isfinite(samples).all():
        raise InvalidArgument(field, f"sample {int(np.argmin(np.isfinite(samples)))} is not a finite number")
    return Recording(samples, rate)


def recording_of_file(data: bytes, field: str = "file") -> Recording:
    """A sound file's bytes (HTTP's upload: WAV, FLAC, Ogg, ...) → Recording (channels mixed down); InvalidArgument
    naming `field` where it cannot be read."""
    try:
        samples, rate = read_audio_bytes(data, "the file")
    except ValueError as err:
        raise InvalidArgument(field, str(err)) from None
    return Recording(samples, rate)


class VoiceBook:
    def __init__(self, backends: Backends, owners: VoiceOwners, max_per_key: int = DEFAULT_MAX_PER_KEY):
        """max_per_key: voices one API key may have at once (0: no limit of its own; the vocoders' --max-voices
        still holds)."""
        self.backends, self.owners, self.max_per_key = backends, owners, max_per_key
        self.making: dict[str, str] = {}  # name → owner, of the voices being made now

    def longest_recording(self) -> float:
        """Seconds of prompt the ready vocoders all take (the shortest of their limits; LONGEST_RECORDING where none
        has said): a longer recording is cut to it."""
        said = [r.max_prompt_seconds for r in self.backends.vocoder.replicas if r.ready and r.max_prompt_seconds]
        return min(said) if said else LONGEST_RECORDING

    def listing(self, owner: str) -> list[gateway_pb2.VoiceInfo]:
        """The voices `owner` may name (voice_owners.owner_of), sorted; UNAVAILABLE while no vocoder has said."""
        names = self.backends.voices(owner)
        if names is None:
            raise Unavailable("vocoder", "no vocoder is ready to say which voices it has")
        return [gateway_pb2.VoiceInfo(name=n, own=owner != SHARED and self.owners.owner(n) == owner) for n in names]

    async def create(self, name: str, recording: Recording, owner: str, budget: float,
                     field: str = "audio") -> gateway_pb2.VoiceInfo:
        """A voice of `recording`, on every vocoder replica, `owner`'s (voice_owners.owner_of) → its summary.
        budget: seconds it may take in all; field: what the door calls the recording (its errors name it)."""
        self._check_name(name)
        replicas = self._check_room(name, owner)
        try:
            check_recording(name, recording.samples, recording.rate, LONGEST_RECORDING, MIN_VOICE_SECONDS)
        except RecordingError as err:
            raise InvalidArgument(field, str(err)) from None
        # longer than a prompt may be: its first seconds, to a pause (as `moss-serve voice --prompt-seconds` cuts it)
        recording = Recording(prompt_cut(recording.samples, recording.rate, self.longest_recording()), recording.rate)
        try:
            check_recording(name, recording.samples, recording.rate, LONGEST_RECORDING, MIN_VOICE_SECONDS)
        except RecordingError as err:  # (what is kept of it is silence)
            raise InvalidArgument(field, f"its first {len(recording.samples) / recording.rate:.2f} s: {err}") from None
        self.making[name] = owner
        try:
            loop = asyncio.get_running_loop()
            began = deadline = loop.time()
            deadline += budget
            pcm = recording.pcm16
            codes = await self._encode(pcm, recording.rate, budget)
            # its owner first: no replica lists the voice before it is known whose (a replica asked again meanwhile)
            self.owners.record(name, owner)
            try:
                added = await self._add_everywhere(replicas, vocoder_pb2.AddVoiceRequest(
                    name=name, prompt_tokens=codes, recording=pcm, recording_rate=recording.rate),
                    deadline - loop.time(), field)
            except BaseException:
                self.owners.forget(name)
                raise
            metrics.VOICE_CREATE.observe(loop.time() - began)
        finally:
            self.making.pop(name, None)
        log.info("gateway: voice %r made (%d codes, %s), on %d vocoder replica(s)", name, len(codes),
                 "a key's own" if owner != SHARED else "everyone's", len(added))
        return gateway_pb2.VoiceInfo(name=name, own=owner != SHARED, prompt_seconds=len(codes) * SECONDS_PER_CODE,
                                     fast=all(a.fast for a in added), kept=all(a.kept for a in added))

    async def delete(self, name: str, owner: str, budget: float) -> None:
        """The voice, made through the API and usable by `owner`, gone from every vocoder replica (those down drop it
        from their voices directory once they read it again: a shared directory; else at the next CreateVoice of it)."""
        if name in self.making or not self.owners.may_use(name, owner) or (
                name not in (self.backends.voices() or ()) and not self.owners.made(name)):
            raise NotFound("name", f"no voice {echo(name)} of yours")
        if not self.owners.made(name):
            raise FailedPrecondition(f"voice {name!r} is one of the vocoders' own (their voices directory, shared): "
                                     "its operator removes it")
        for replica in self.backends.vocoder.replicas:
            try:
                await replica.stub.RemoveVoice(vocoder_pb2.RemoveVoiceRequest(name=name), timeout=budget)
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:  # (a replica that had not got it: nothing to remove)
                    raise stage_error("vocoder", err.code(), err.details()) from None
            if replica.voices is not None:
                replica.voices = tuple(v for v in replica.voices if v != name)
                replica.voices_changed = time.monotonic()
        self.owners.forget(name)
        metrics.VOICES_DELETED.inc()
        log.info("gateway: voice %r deleted", name)

    # ---- steps ---------------------------------------------------------------------------------------------------
    def _check_name(self, name: str) -> None:
        if not NAME.match(name) or name == DEFAULT:
            raise InvalidArgument("name", f"{echo(name)} is not a name a voice may take: {NAME_RULE}, not "
                                          f"{DEFAULT!r}")

    def _check_room(self, name: str, owner: str) -> list[Replica]:
        """The vocoder replicas the voice goes to, once it may: a free name, room under the limits, every replica
        ready and one that makes voices."""
        if name in (self.backends.voices() or ()) or self.owners.made(name) or name in self.making:
            raise AlreadyExists(f"a voice named {name!r} exists already; choose another name")
        # Each voice holds the vocoders' device from their streams for a moment: a few at a time, one per key.
        if owner != SHARED and owner in self.making.values():
            raise ResourceExhausted("this API key is making a voice already: one at a time", MAKING_RETRY_SECONDS)
        if len(self.making) >= MAX_MAKING:
            raise ResourceExhausted(f"the gateway is making {MAX_MAKING} voices already", MAKING_RETRY_SECONDS)
        if owner != SHARED and self.max_per_key and self.owners.count(owner) >= self.max_per_key:
            raise ResourceExhausted(f"this API key has its most voices, {self.max_per_key} (--max-voices-per-key); "
                                    "delete one first")
        replicas = self.backends.vocoder.replicas
        if down := [r for r in replicas if not r.ready or r.voices is None]:
            raise Unavailable("vocoder", f"{down[0].target} is not ready: a voice goes to every replica or to none; "
                                         "try again once it is")
        if any(not r.max_prompt_seconds for r in replicas):
            raise FailedPrecondition("the vocoder's token decoder (the stand-in) speaks in no voice")
        if full := [r for r in replicas if r.max_voices and len(r.voices) >= r.max_voices]:
            raise ResourceExhausted(f"the vocoder holds its most voices, {full[0].max_voices} (--max-voices); delete "
                                    "one first")
        return replicas

    async def _encode(self, pcm: bytes, rate: int, budget: float) -> list[int]:
        """The recording's codes, from one Encode call (one of the encoder's speaker places while it runs)."""
        replica = await self.backends.acquire_encoder(budget)
        call = replica.stub.Encode(timeout=budget)
        replica.add_calls(1)
        try:
            await call.write(encoder_pb2.EncodeRequest(config=encoder_pb2.EncodeConfig(
                sample_rate=rate, format=common_pb2.AUDIO_FORMAT_PCM16)))
            for at in range(0, len(pcm), CHUNK_BYTES):
                await call.write(encoder_pb2.EncodeRequest(audio=encoder_pb2.AudioData(pcm=pcm[at : at + CHUNK_BYTES])))
            await call.write(encoder_pb2.EncodeRequest(end=encoder_pb2.EndOfTurn()))
            await call.done_writing()
            async for reply in call:
                kind = reply.WhichOneof("kind")
                if kind == "refused":
                    raise refusal(reply.refused)
                if kind == "turn":
                    return list(reply.turn.codes)
            raise Unavailable("encoder", "the call ended without the recording's codes")
        except grpc.aio.AioRpcError as err:
            raise stage_error("encoder", err.code(), err.details()) from None
        finally:
            call.cancel()
            replica.add_calls(-1)

    async def _add_everywhere(self, replicas: list[Replica], request: vocoder_pb2.AddVoiceRequest, budget: float,
                              field: str) -> list[vocoder_pb2.AddVoiceResponse]:
        """AddVoice on every replica, one after another; one that fails has those before it remove the voice again,
        so that none keeps what the others lack."""
        added: list[tuple[Replica, vocoder_pb2.AddVoiceResponse]] = []
        try:
            for replica in replicas:
                try:
                    added.append((replica, await replica.stub.AddVoice(request, timeout=max(budget, 0.1))))
                except grpc.aio.AioRpcError as err:
                    raise vocoder_error(err, field) from None
        except BaseException:
            for replica, _ in added:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await asyncio.shield(replica.stub.RemoveVoice(vocoder_pb2.RemoveVoiceRequest(name=request.name),
                                                                  timeout=10))
            raise
        for replica, _ in added:
            replica.voices = tuple(sorted({*(replica.voices or ()), request.name}))
            replica.voices_changed = time.monotonic()
        return [response for _, response in added]


def vocoder_error(err: grpc.aio.AioRpcError, field: str) -> ServiceError:
    """A vocoder's AddVoice refusal as the client's error (field: what the door calls the recording): its own code
    where it judged the request (the recording, the name, its limits), else the stage's failure."""
    code, details = err.code(), err.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        named, _, problem = details.partition(": ")
        return InvalidArgument(field if named in ("recording", "prompt_tokens") else named, problem or details)
    if code == grpc.StatusCode.ALREADY_EXISTS:
        return AlreadyExists(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ResourceExhausted(details)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return FailedPrecondition(f"vocoder: {details}")
    return stage_error("vocoder", code, details)
