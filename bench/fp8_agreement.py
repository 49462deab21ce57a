"""How far `--quantization fp8` moves what the llm says, on your checkpoint: its replies against the model's own dtype's.

FP8 layer products buy capacity beside the vocoder (docs/running.md, docs/benchmarks.md) but change the model's numbers, so it
is off by default until a checkpoint is judged with it. This gives the numbers to judge with (and, with a vocoder, the
replies to listen to). Each prompt is answered twice per sampling mode, once by an engine in the model's dtype and once
by an FP8 engine, in the same seeded way (greedy, and the model's sampling with a fixed seed: both draw the same random
numbers, so they pick the same tokens until their distributions part). Until the first step whose token differs both
engines saw the same sequence, so every step up to it compares the two heads' outputs on the same input:
- top-1: both heads' largest logit on the same token;
- KL: KL(model || fp8) of the sampled head's distribution at the mode's temperature (1 for greedy), nats;
- rel. error: |fp8 - model| / |model| of the logits.
and the first difference says how long a reply stays the same. Random weights (no --model-dir) say little: their
distributions are nearly flat, so small changes flip their choices; the tool is for trained weights.

  python3 bench/fp8_agreement.py --model-dir /path/to/MOSS-Speech --device cuda [--prompts FILE] [--max-new-tokens 200]
      [--vocoder-dir /path/to/codec --wav-dir fp8_wavs]   # each sampled pair of replies as WAVs, to listen to
  python3 bench/fp8_agreement.py --preset tiny            # the plumbing on a CPU, random weights

Prints a table per mode and writes JSON (--json). Both engines are held at once (the FP8 one keeps its layers in FP8
only): ~26 GB at the real size in bf16 + FP8, ~43 GB while the FP8 one is built from its own bf16 load, plus
--kv-cache-gb each. Not yet run on a GPU nor on a trained checkpoint (tests/test_fp8_agreement.py: the tiny model).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "protos")]

from services.bench.workload import load_prompts  # noqa: E402
from services.common.sampling import ChunkSettings, SamplingSettings  # noqa: E402
from services.llm.engine.engine import GenerationRequest, LLMEngine  # noqa: E402
from services.llm.engine.reference import traced_generation  # noqa: E402
from services.llm.server import build_engine  # noqa: E402
from services.llm.settings import LlmSettings  # noqa: E402

# The official loop's sampling (shared/DESIGN.md §3), and greedy; repetition penalty off in greedy so that both modes
# differ only in how a token is drawn.
MODES = {
    "greedy": SamplingSettings(temperature=0.0, repetition_penalty=1.0, min_new_tokens=0),
    "sampled": SamplingSettings(seed=1234),
}


@dataclass
class Reply:
    text_ids: list[int]
    audio_ids: list[int]
    logits: list[torch.Tensor]   # per step, the sampled head's logits [V] (float32, on the CPU)


@dataclass
class Agreement:
    prompt: int
    steps: int                       # the model's reply, steps
    fp8_steps: int
    first_difference: int | None     # the first step whose sampled token differs (None: the same reply)
    compared: int                    # steps compared (up to and including the first difference)
    top1: float                      # share of compared steps whose heads agree on the largest logit
    kl: float                        # mean KL(model || fp8) over compared steps, nats
    max_relative_error: float
    audio_ids: list[int] = field(repr=False, default_factory=list)
    fp8_audio_ids: list[int] = field(repr=False, default_factory=list)


def reply(engine: LLMEngine, prompt: str, sampling: SamplingSettings, request_id: str) -> Reply:
    seq = engine.make_sequence(GenerationRequest(request_id, sampling, ChunkSettings(), text=prompt))
    logits = [(text if text is not None else audio).float().cpu() for text, audio in traced_generation(engine, seq)]
    return Reply(seq.text_ids[seq.num_prompt :], seq.audio_ids[seq.num_prompt :], logits)


def as_sampled(cfg, step: int, logits: torch.Tensor, min_new_tokens: int) -> torch.Tensor:
    """A step's head logits as the sampler weighs them: an audio step's without the ids it never samples (at or above
    audio_logits_limit; eosp before min_new_tokens). (The repetition penalty is left out: both engines' replies are
    the same up to the steps compared, so it would move both alike.)"""
    if logits.numel() != cfg.audio_vocab_size:
        return logits
    logits = logits[: cfg.audio_logits_limit].clone()
    if step < min_new_tokens:
        logits[cfg.eosp_token_id] = float("-inf")
    return logits


def compare(prompt: int, model: Reply, fp8: Reply, temperature: float, view=lambda step, logits: logits) -> Agreement:
    """The two replies of one prompt: their first different token, and their heads' outputs on the same input up to it
    (view(step, logits): what the sampler weighs of them, as_sampled)."""
    pairs = list(zip(model.text_ids, model.audio_ids))
    fp8_pairs = list(zip(fp8.text_ids, fp8.audio_ids))
    first = next((i for i, (a, b) in enumerate(zip(pairs, fp8_pairs)) if a != b), None)
    if first is None and len(pairs) != len(fp8_pairs):
        first = min(len(pairs), len(fp8_pairs))  # one stopped where the other went on
    compared = min(len(model.logits), len(fp8.logits), len(pairs) if first is None else first + 1)
    top1, kls, errors = [], [], []
    for step, (a, b) in enumerate(zip(model.logits[:compared], fp8.logits[:compared])):
        if a.shape != b.shape:  # the two sampled different heads: their modes parted (a different token before)
            break
        a, b = view(step, a), view(step, b)
        finite = torch.isfinite(a) & torch.isfinite(b)  # masked ids are -inf in both
        top1.append(int(a.argmax()) == int(b.argmax()))
        p, q = (torch.log_softmax(x[finite] / temperature, dim=0) for x in (a, b))
        kls.append(float((p.exp() * (p - q)).sum()))
        errors.append(float((b[finite] - a[finite]).norm() / a[finite].norm().clamp_min(1e-30)))
    return Agreement(prompt, len(pairs), len(fp8_pairs), first, len(top1), _mean(top1), _mean(kls),
                     max(errors, default=math.nan), list(model.audio_ids), list(fp8.audio_ids))


def _mean(values) -> float:
    return statistics.fmean(values) if values else math.nan


def summarize(rows: list[Agreement]) -> dict:
    steps = sum(r.compared for r in rows)
    firsts = [r.first_difference for r in rows if r.first_difference is not None]
    return {
        "replies": len(rows),
        "identical": sum(r.first_difference is None for r in rows),
        "first_difference_median": statistics.median(firsts) if firsts else None,
        "steps_compared": steps,
        "top1": sum(r.top1 * r.compared for r in rows) / steps if steps else math.nan,
        "kl_mean": sum(r.kl * r.compared for r in rows if r.compared) / steps if steps else math.nan,
        "max_relative_error": max((r.max_relative_error for r in rows if r.compared), default=math.nan),
    }


def table(mode: str, rows: list[Agreement], summary: dict) -> str:
    out = [f"{mode}: {summary['identical']} of {summary['replies']} replies identical; first difference at step "
           f"{summary['first_difference_median']} (median of the others); over {summary['steps_compared']} steps on the "
           f"same input: top-1 {summary['top1']:.4f}, KL {summary['kl_mean']:.3g} nats, largest rel. error "
           f"{summary['max_relative_error']:.3g}",
           f"  {'prompt':>6} {'steps':>6} {'fp8':>6} {'first diff':>10} {'top-1':>7} {'KL':>10} {'rel. err':>9}"]
    for r in rows:
        first = "-" if r.first_difference is None else str(r.first_difference)
        out.append(f"  {r.prompt:>6} {r.steps:>6} {r.fp8_steps:>6} {first:>10} {r.top1:>7.3f} {r.kl:>10.3g} "
                   f"{r.max_relative_error:>9.3g}")
    return "\n".join(out)


def vocode_pairs(rows: list[Agreement], vocoder_dir: str | None, preset: str, device: str, wav_dir: Path) -> list[str]:
    """Each prompt's two sampled replies through the vocoder, whole, as WAVs to listen to → the files written."""
    from services.common.audio import write_wav
    from services.vocoder.loader import load_vocoder
    from services.vocoder.streamer import MelStreamer

    vocoder = load_vocoder(vocoder_dir, preset, device=device)
    wav_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for r in rows:
        for name, tokens in (("model", r.audio_ids), ("fp8", r.fp8_audio_ids)):
            tokens = [t for t in tokens if 0 <= t < vocoder.codebook_size]  # (audio_pad, eosp: not codes)
            streamer = MelStreamer(vocoder)
            samples = torch.cat([torch.as_tensor(streamer.push(tokens)), torch.as_tensor(streamer.flush())])
            path = wav_dir / f"prompt{r.prompt:02d}_{name}.wav"
            write_wav(str(path), samples.numpy(), vocoder.sample_rate)
            written.append(str(path))
    return written


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", help="the checkpoint (as `moss-serve llm --model-dir`); without it: --preset, random")
    ap.add_argument("--preset", default="tiny", help="without --model-dir: random weights at this preset's size")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", help="a file of prompts, one per line (default: the bench's built-in ones)")
    ap.add_argument("--max-new-tokens", type=int, default=200)
    ap.add_argument("--kv-cache-gb", type=float, default=2.0, help="each engine's KV pool")
    ap.add_argument("--modes", default="greedy,sampled", help=f"of {', '.join(MODES)}")
    ap.add_argument("--vocoder-dir", help="the codec's directory: write each sampled pair of replies as WAVs")
    ap.add_argument("--vocoder-preset", help="without --vocoder-dir: a vocoder preset with random weights (tests)")
    ap.add_argument("--wav-dir", default="fp8_wavs")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if unknown := [m for m in modes if m not in MODES]:
        ap.error(f"--modes: unknown {unknown}; known: {', '.join(MODES)}")
    prompts = load_prompts(args.prompts)
    base = dict(model_dir=args.model_dir, preset=args.preset, device=args.device, kv_cache_gb=args.kv_cache_gb)
    engines = {q: build_engine(LlmSettings(**base, quantization=q)) for q in ("none", "fp8")}
    results = {"args": vars(args), "modes": {}}
    for mode in modes:
        sampling = dataclasses.replace(MODES[mode], max_new_tokens=args.max_new_tokens)
        temperature = sampling.temperature or 1.0
        cfg = engines["none"].cfg
        view = lambda step, logits: as_sampled(cfg, step, logits, sampling.min_new_tokens)  # noqa: E731
        rows = []
        for i, prompt in enumerate(prompts):
            model, fp8 = (reply(engines[q], prompt, sampling, f"{mode}-{q}-{i}") for q in ("none", "fp8"))
            rows.append(compare(i, model, fp8, temperature, view))
        summary = summarize(rows)
        print(table(mode, rows, summary), flush=True)
        results["modes"][mode] = {"summary": summary, "replies": [asdict(r) for r in rows]}
        if mode == "sampled" and (args.vocoder_dir or args.vocoder_preset):
            results["wavs"] = vocode_pairs(rows, args.vocoder_dir, args.vocoder_preset or "moss-speech", args.device,
                                           Path(args.wav_dir))
            print(f"wrote {len(results['wavs'])} WAVs to {args.wav_dir}/ (the model's and FP8's reply to each prompt)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
        print(f"JSON: {args.json}")
    return results


if __name__ == "__main__":
    main()
