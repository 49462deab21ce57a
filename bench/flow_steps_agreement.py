"""How far fewer Euler steps in the codec's flow (`--flow-steps`) move what the vocoder says, on your codec: the same
tokens decoded with the checkpoint's steps and with fewer.

`--flow-steps 5` buys capacity (docs/running.md, docs/benchmarks.md) but solves the flow's ODE more coarsely, so it is off by
default until a codec is judged with it. This gives the numbers to judge with, and the WAVs to listen to. Every steps
count decodes the same tokens in the same voice, offline in the served block-causal mode, from the same noise (the
flow's noise is a fixed table, HiFT's is seeded from sample 0), so the outputs differ by the steps alone. Against the
first steps count of --steps (the reference; default the checkpoint's):
- mel dB: the mean |difference| of the flow's log-mel, in dB;
- audio dB: the same of the log-mel of the waveforms HiFT made (the flow's format, analysed again from the samples);
and, for utterances given as speech (--wav, coded by the encoder):
- source dB: the audio's log-mel against the speech's own, for every steps count, the reference's included: how much
  further from the speech fewer steps take the codec than its own steps do. The decodes speak in --voice: make it from
  the same speaker (`moss-serve voice`), or the source figure holds the change of speaker too.

  python3 bench/flow_steps_agreement.py --vocoder-dir /path/to/codec --encoder-dir /path/to/tokenizer \\
      --wav a.wav b.wav --steps 10,8,6,5 --device cuda --wav-dir steps_wavs --json steps.json
  python3 bench/flow_steps_agreement.py --tokens-file tokens.json ...   # [[code, ...], ...]: replies' audio codes
  python3 bench/flow_steps_agreement.py --preset tiny-codec            # the plumbing on a CPU, random weights

Random weights (no --vocoder-dir) say nothing of quality: the tool is for the trained codec. Not yet run on one here.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "protos")]

from services.common.audio import read_audio, write_wav  # noqa: E402
from services.vocoder.loader import FlowOptions, load_vocoder  # noqa: E402
from services.vocoder.vocoder import TokenVocoder  # noqa: E402
from services.voice_maker import ENCODER_RATE, MEL_RATE, flow_mel, resample  # noqa: E402

DB_PER_NEPER = 20 / math.log(10)  # the flow's log-mel is the natural log of a magnitude


@dataclass
class Utterance:
    name: str
    tokens: list[int]
    speech: np.ndarray | None = None  # its source at 24 kHz, if it came as speech


@dataclass
class Row:
    utterance: str
    steps: int
    mel_db: float           # the flow's log-mel against the reference steps', mean |difference|
    audio_db: float         # the waveform's log-mel against the reference steps' waveform's
    source_db: float | None  # the waveform's log-mel against the source speech's (None: tokens given, no speech)


def mean_db(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two log-mels [frames, bands] (natural log), cut to the shorter → mean |a - b| in dB."""
    n = min(len(a), len(b))
    return float((a[:n] - b[:n]).abs().mean()) * DB_PER_NEPER


def decode(vocoder: TokenVocoder, tokens: list[int], voice: str) -> tuple[torch.Tensor, np.ndarray]:
    """tokens → (the flow's log-mel [frames, bands] on the host, float32 samples at the codec's rate)."""
    mel = vocoder.mel(tokens, voice)
    return mel.float().cpu().transpose(0, 1), vocoder.waveform(mel)


def compare(utterances: list[Utterance], vocoders: dict[int, TokenVocoder], voice: str = "",
            wav_dir: Path | None = None) -> list[Row]:
    """Each utterance decoded by each vocoder (by steps, the reference first) → a row per (utterance, steps)."""
    rows = []
    for u in utterances:
        ref_mel = ref_audio = None
        source = flow_mel(u.speech) if u.speech is not None else None
        for steps, vocoder in vocoders.items():
            mel, samples = decode(vocoder, u.tokens, voice)
            if vocoder.sample_rate != MEL_RATE:
                samples = resample(samples, vocoder.sample_rate, MEL_RATE)
            audio = flow_mel(samples.astype(np.float32))
            if ref_mel is None:
                ref_mel, ref_audio = mel, audio
            rows.append(Row(u.name, steps, mean_db(mel, ref_mel), mean_db(audio, ref_audio),
                            None if source is None else mean_db(audio, source)))
            if wav_dir is not None:
                wav_dir.mkdir(parents=True, exist_ok=True)
                write_wav(str(wav_dir / f"{u.name}_steps{steps}.wav"), samples, MEL_RATE)
    return rows


def utterances(args, codebook_size: int) -> list[Utterance]:
    """What to decode: speech coded by the encoder, token lists from a file, or random codes (the plumbing)."""
    out = []
    if args.wav:
        from services.encoder.checkpoint import load_tokenizer, random_tokenizer
        from services.encoder.config import glm4_voice, tiny
        from services.encoder.stream import encode

        if args.encoder_dir:
            encoder = load_tokenizer(args.encoder_dir)
        else:
            encoder = random_tokenizer(glm4_voice() if args.preset == "moss-speech" else tiny())
            print("flow_steps_agreement: no --encoder-dir: RANDOM encoder weights make the codes (plumbing only)",
                  file=sys.stderr)
        encoder = encoder.to(args.device)
        for path in args.wav:
            samples, rate = read_audio(str(path))
            codes = encode(encoder, torch.from_numpy(resample(samples, rate, ENCODER_RATE)))
            if max(codes) >= codebook_size:
                raise SystemExit(f"flow_steps_agreement: the encoder's codes reach {max(codes)}, past the codec's "
                                 f"{codebook_size}: not the codec's encoder")
            out.append(Utterance(Path(path).stem, codes, resample(samples, rate, MEL_RATE)))
    if args.tokens_file:
        for i, tokens in enumerate(json.loads(Path(args.tokens_file).read_text())):
            if not tokens or not all(isinstance(t, int) and 0 <= t < codebook_size for t in tokens):
                raise SystemExit(f"flow_steps_agreement: {args.tokens_file}[{i}]: not a list of codes in [0, {codebook_size})")
            out.append(Utterance(f"tokens{i}", tokens))
    rng = np.random.default_rng(args.seed)
    for i in range(args.random):
        out.append(Utterance(f"random{i}", rng.integers(0, codebook_size, args.random_tokens).tolist()))
    return out


def summary(rows: list[Row]) -> list[dict]:
    """Per steps count: the means over utterances."""
    out = []
    for steps in dict.fromkeys(r.steps for r in rows):
        mine = [r for r in rows if r.steps == steps]
        sources = [r.source_db for r in mine if r.source_db is not None]
        out.append({"steps": steps, "utterances": len(mine),
                    "mel_db": sum(r.mel_db for r in mine) / len(mine),
                    "audio_db": sum(r.audio_db for r in mine) / len(mine),
                    "source_db": sum(sources) / len(sources) if sources else None})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocoder-dir", help="the codec (codec.json, flow.pt, hift.pt; voices/); none: --preset, random")
    p.add_argument("--voices-dir", help="its voices (default: <vocoder-dir>/voices)")
    p.add_argument("--voice", default="", help="the voice to speak in (default: the default voice)")
    p.add_argument("--preset", default="tiny-codec", choices=["tiny-codec", "moss-speech"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", default="", help="Euler steps, comma-separated, the reference first (default: the "
                                                "checkpoint's, then 8, 6, 5)")
    p.add_argument("--wav", nargs="*", default=[], help="speech to code with the encoder and decode")
    p.add_argument("--encoder-dir", help="the encoder (GLM-4-Voice tokenizer) for --wav; none: random weights")
    p.add_argument("--tokens-file", help="a JSON list of lists of audio codes to decode")
    p.add_argument("--random", type=int, default=0, help="this many random token lists (the plumbing)")
    p.add_argument("--random-tokens", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wav-dir", type=Path, help="write each decode as <utterance>_steps<N>.wav here")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)

    def vocoder(steps: int | None) -> TokenVocoder:
        return load_vocoder(args.vocoder_dir, args.preset, args.device, voices_dir=args.voices_dir,
                            flow=FlowOptions(n_timesteps=steps, history_streams=0))  # (offline: no stream keeps frames)

    first = vocoder(None)
    checkpoint_steps = first.decoder.flow.decoder.n_timesteps
    steps = [int(s) for s in args.steps.split(",")] if args.steps else [checkpoint_steps, 8, 6, 5]
    if len(set(steps)) != len(steps) or min(steps) < 1:
        raise SystemExit(f"flow_steps_agreement: --steps must be distinct positive counts, got {args.steps}")
    if not (args.wav or args.tokens_file or args.random):
        args.random = 2
    todo = utterances(args, first.codebook_size)
    vocoders = {s: first if s == checkpoint_steps else vocoder(s) for s in steps}
    rows = compare(todo, vocoders, args.voice, args.wav_dir)

    print(f"{len(todo)} utterances; against {steps[0]} steps (mean |difference| of log-mel, dB)")
    print(f"{'steps':>5}  {'mel dB':>7}  {'audio dB':>8}  {'source dB':>9}")
    table = summary(rows)
    for s in table:
        source = f"{s['source_db']:9.3f}" if s["source_db"] is not None else f"{'-':>9}"
        print(f"{s['steps']:>5}  {s['mel_db']:7.3f}  {s['audio_db']:8.3f}  {source}")
    if args.json:
        args.json.write_text(json.dumps({"reference_steps": steps[0], "device": args.device,
                                         "vocoder_dir": args.vocoder_dir, "summary": table,
                                         "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
