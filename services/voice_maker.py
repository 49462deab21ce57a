"""`moss-serve voice WAV`: a voice for the codec's flow decoder, made from a recording of the speaker.

A voice (services/vocoder/codec/voice.py) is three things the flow is conditioned on, each computed as the codec's
reference front end computes it (CosyVoice2's, read, not copied):

- `prompt_tokens` [P]: the recording's audio codes, from our encoder (the GLM-4-Voice tokenizer) at 16 kHz;
- `prompt_mel` [4·P, 80]: its log-mel at 24 kHz in the flow's format (Matcha-TTS's: n_fft 1920, hop 480, window
  1920, 80 bands over 0-8 kHz, reflect-padded by (n_fft − hop) / 2 each side and not centred, log of the magnitude
  clamped at 1e-5), cut with the codes to a whole number of codes (4 frames each);
- `embedding` [192]: the speaker's x-vector, from a speaker-embedding model in ONNX (the reference's CAM++,
  `campplus.onnx`) run by onnxruntime over the recording's 80-bin Kaldi fbank at 16 kHz (kaldi-native-fbank;
  dither 0, the mean over time taken away), as the reference does.

Nothing is downloaded: the speaker model and the encoder's weights are files the user gives (without
`--encoder-dir` the encoder preset's random weights give codes that mean nothing, and the tool says so).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from services.common.audio import read_audio
from services.common.mel_filters import mel_filters
from services.common.recording import RecordingError, check_recording, prompt_cut
from services.vocoder.codec.voice import Voice, check, save_voice

MEL_RATE, N_FFT, HOP, N_MELS, FMAX = 24_000, 1920, 480, 80, 8000
ENCODER_RATE = 16_000
# A missing or unreadable input (a recording, the speaker model), said with what to give instead.
VoiceMakerError = RecordingError


def resample(samples: np.ndarray, rate: int, to: int) -> np.ndarray:
    import soxr

    return samples if rate == to else soxr.resample(samples, rate, to, quality="HQ").astype(np.float32)


def flow_mel(samples24k: np.ndarray) -> torch.Tensor:
    """[T] at 24 kHz → the flow's log-mel [frames, 80] (module docstring)."""
    basis = torch.from_numpy(mel_filters(MEL_RATE, N_FFT, N_MELS, fmin=0, fmax=FMAX))
    pad = (N_FFT - HOP) // 2
    y = torch.nn.functional.pad(torch.from_numpy(samples24k)[None, None], (pad, pad), mode="reflect")[0]
    spec = torch.stft(y, N_FFT, HOP, N_FFT, window=torch.hann_window(N_FFT), center=False, return_complex=True)
    magnitude = torch.sqrt(spec.real.pow(2) + spec.imag.pow(2) + 1e-9)                         # [1, 961, frames]
    return torch.log(torch.clamp(basis @ magnitude, min=1e-5))[0].transpose(0, 1)             # [frames, 80]


def fbank(samples16k: np.ndarray) -> np.ndarray:
    """[T] at 16 kHz → Kaldi's 80-bin log fbank [frames, 80] (25 ms windows every 10 ms, dither 0), the mean over
    time taken away: the speaker model's input."""
    import kaldi_native_fbank as knf

    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = ENCODER_RATE
    opts.frame_opts.dither = 0.0
    opts.mel_opts.num_bins = N_MELS
    computer = knf.OnlineFbank(opts)
    computer.accept_waveform(ENCODER_RATE, samples16k.tolist())
    computer.input_finished()
    if computer.num_frames_ready == 0:
        raise VoiceMakerError("the recording is shorter than one 25 ms frame")
    feats = np.stack([computer.get_frame(i) for i in range(computer.num_frames_ready)]).astype(np.float32)
    return feats - feats.mean(axis=0, keepdims=True)


def speaker_embedding(model_path: str | Path, samples16k: np.ndarray) -> torch.Tensor:
    """The x-vector [D] of a speaker-embedding ONNX model that takes fbank [1, frames, 80] (CAM++'s interface)."""
    path = Path(model_path)
    if not path.is_file():
        raise VoiceMakerError(f"speaker model {path}: no such file; give the codec's speaker-embedding model in ONNX "
                              f"(CosyVoice2's campplus.onnx, beside its flow.pt and hift.pt)")
    session = _session(str(path.resolve()), path.stat().st_mtime_ns)
    out = session.run(None, {session.get_inputs()[0].name: fbank(samples16k)[None]})[0]
    return torch.from_numpy(np.asarray(out, np.float32).reshape(-1))


@functools.lru_cache(maxsize=4)
def _session(path: str, mtime_ns: int):
    """The model's onnxruntime session, made once per file (and again if the file changes)."""
    import onnxruntime

    try:
        # one thread: a voice is made beside the streams playing, on a host whose cores serve them
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001  onnxruntime's own errors: a file that is not a model
        raise VoiceMakerError(f"speaker model {path}: onnxruntime cannot load it ({exc})") from None


def warm_up(speaker_model: str | Path) -> float:
    """Make what a voice's first making would make (the imports, the speaker model's session, the mel basis) on a
    second of a tone → seconds it took. A vocoder does it once it serves, so that its first AddVoice is as fast as
    the next."""
    import time

    began = time.perf_counter()
    tone = (0.1 * np.sin(2 * np.pi * 220 * np.arange(MEL_RATE) / MEL_RATE)).astype(np.float32)
    flow_mel(tone)
    speaker_embedding(speaker_model, resample(tone, MEL_RATE, ENCODER_RATE))
    return time.perf_counter() - began


def stand_in_speaker_model(path: str | Path, dim: int = 192, seed: int = 0) -> np.ndarray:
    """A stand-in for CAM++ with its interface, for random weights (tests, benches): fbank [1, frames, 80] → [1, dim],
    the sum of squares over time by a random matrix, written to `path` in ONNX → that matrix [80, dim]. Needs the
    `onnx` package (a dev dependency)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(seed).normal(size=(80, dim)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("ReduceSumSquare", ["feats", "axes"], ["energy"], keepdims=0),
         helper.make_node("MatMul", ["energy", "w"], ["embedding"])],
        "speaker", [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, None, 80])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, dim])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes"), numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return w


def make_voice(name: str, samples: np.ndarray, rate: int, encoder, speaker_model: str | Path, flow_cfg,
               max_seconds: float = 30.0, prompt_seconds: float | None = None) -> Voice:
    """A recording → its voice, checked against the flow's config (VoiceMakerError, or VoiceError for a voice that
    does not fit it: e.g. an x-vector of another size). encoder: the WhisperVQEncoder that makes the codes.
    prompt_seconds: a longer recording cut to it at a pause first (recording.prompt_cut, as the API cuts one)."""
    from services.encoder.stream import encode

    check_recording(name, samples, rate, max_seconds)
    if prompt_seconds is not None:
        samples = prompt_cut(samples, rate, prompt_seconds, min_seconds=0.08)
    w = encoder.codebook.weight
    samples16k = resample(samples, rate, ENCODER_RATE)
    codes = torch.tensor(encode(encoder, torch.from_numpy(samples16k).to(w.device)), dtype=torch.long)
    return voice_from(name, codes, samples, rate, speaker_model, flow_cfg, max_seconds)


def voice_from(name: str, codes: torch.Tensor, samples: np.ndarray, rate: int, speaker_model: str | Path, flow_cfg,
               max_seconds: float = 30.0, min_seconds: float = 0.08) -> Voice:
    """A recording and its codes (the encoder's, made by `make_voice` here or by the encoder service for the
    vocoder's AddVoice) → its voice: the mel at 24 kHz and the x-vector at 16 kHz made here, both cut with the codes
    to a whole number of codes, checked against the flow's config. The one implementation of `moss-serve voice` and
    of a voice made through the API."""
    check_recording(name, samples, rate, max_seconds, min_seconds)
    samples16k = resample(samples, rate, ENCODER_RATE)
    mel = flow_mel(resample(samples, rate, MEL_RATE))
    ratio = flow_cfg.token_mel_ratio
    tokens = min(len(codes), mel.shape[0] // ratio)
    if tokens == 0:
        raise VoiceMakerError("the recording is too short to give one code (80 ms)")
    voice = Voice(name, codes[:tokens], mel[: ratio * tokens], speaker_embedding(speaker_model, samples16k))
    return check(voice, flow_cfg, f"voice {name!r}")


def run(args) -> int:
    """`moss-serve voice` with its parsed flags → exit status."""
    import sys

    from services.encoder.checkpoint import load_tokenizer, random_tokenizer
    from services.encoder.config import glm4_voice, tiny
    from services.vocoder.codec import config as codec_config
    from services.vocoder.codec.voice import VoiceError

    try:
        if args.encoder_dir:
            encoder = load_tokenizer(args.encoder_dir)
        else:
            encoder = random_tokenizer(glm4_voice() if args.preset == "moss-speech" else tiny())
            print(f"moss-serve voice: no --encoder-dir: the {args.preset!r} encoder with RANDOM weights makes the "
                  f"codes (a voice for tests only)", file=sys.stderr)
        flow_cfg = (codec_config.read_config(Path(args.vocoder_dir) / "codec.json") if args.vocoder_dir else
                    codec_config.moss_speech() if args.preset == "moss-speech" else codec_config.tiny()).flow
        samples, rate = read_audio(str(args.wav))
        voice = make_voice(args.name, samples, rate, encoder, args.speaker_model, flow_cfg, args.max_seconds,
                           args.prompt_seconds)
    except (VoiceMakerError, VoiceError, FileNotFoundError, ValueError) as err:
        print(f"moss-serve voice: {err}", file=sys.stderr)
        return 2
    try:
        path = save_voice(voice, args.voices_dir)
    except OSError as err:
        print(f"moss-serve voice: cannot write in {args.voices_dir}: {err.strerror or err}", file=sys.stderr)
        return 2
    print(f"wrote {path}: {len(voice.prompt_tokens)} codes ({len(voice.prompt_tokens) * 0.08:.2f} s), mel "
          f"{tuple(voice.prompt_mel.shape)}, x-vector of {voice.embedding.numel()}")
    return 0
