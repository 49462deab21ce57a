"""The codec decoder's paths against the reference run eagerly (the peer: CosyVoice2's flow and HiFT modules from the
cosyvoice2-eu wheel, as MOSS-Speech's decoder runs them: float32, one stream at a time), on one GPU, in one run,
random weights at the real size (flow 119M, HiFT 21M parameters), one voice of --prompt-tokens prompt tokens.

    python bench/codec.py --device cuda --json out.json

Paths: flow + HiFT (the codec's own), flow + BigVGAN-v2 (the design's generator, 24 kHz / 80 bands / hop 480),
and the flow alone. Cells:
- correctness: our flow and HiFT (float32, eager) against the reference's for the same block (max |diff|), and
  ours as served (bf16, CUDA graphs) against the reference (SNR, dB);
- first chunk: a stream's first block (the first block's tokens and the look-ahead after them) → samples on the
  host, batch 1, median of --reps;
- aggregate at 8, 32, 64, 128 streams: every stream with a block due (5 tokens, 0.4 s of audio) in a saturated
  window (--context tokens) → samples; ours batches the streams in calls of --max-batch (as the vocoder's
  worker does), the reference decodes them one after another (it has no batching): seconds of audio per second.
The reference's flow twice: as MOSS-Speech runs it (float32, eager, a stream at a time), and as a serving stack would
(codec_reference.ServedReference: bf16, the same calls of --max-batch streams in one batch, the whole call replayed
from a CUDA graph; CosyVoice's own runtime batches its estimator in TensorRT, which cannot be installed here).
Targets: flow at 64 streams ≥ 5x the reference's eager aggregate.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from codec_reference import ServedReference, reference_flow, reference_hift  # noqa: E402
from measure import median_time, snr_db  # noqa: E402
from services.vocoder import generator as gen  # noqa: E402
from services.vocoder.codec.checkpoint import load_into  # noqa: E402
from services.vocoder.codec.config import PRESETS  # noqa: E402
from services.vocoder.codec.decoder import FlowTokenDecoder  # noqa: E402
from services.vocoder.codec.flow import CausalMaskedDiffWithXvec  # noqa: E402
from services.vocoder.codec.flow_state import FlowState  # noqa: E402
from services.vocoder.codec.hift import HiFTGenerator, receptive_field  # noqa: E402
from services.vocoder.codec.voice import random_voice  # noqa: E402
from services.vocoder.runner import GeneratorRunner  # noqa: E402
from services.vocoder.streamer import DEFAULT_LOOKAHEAD  # noqa: E402

BLOCK_SECONDS = 0.4  # 5 tokens of 80 ms


def build(device, preset: str):
    """The reference's modules with random weights (scaled as random_codec scales ours), and ours loaded from them."""
    cfg = PRESETS[preset]()
    torch.manual_seed(0)
    ref_flow, ref_hift = reference_flow(cfg), reference_hift(cfg)
    with torch.no_grad():
        for name, p in ref_flow.named_parameters():
            if name.endswith("pos_bias_u") or name.endswith("pos_bias_v"):
                torch.nn.init.xavier_uniform_(p)
        ref_flow.decoder.estimator.final_proj.weight.mul_(0.1)
        ref_hift.f0_predictor.classifier.bias.fill_(200.0)
    flow, hift = CausalMaskedDiffWithXvec(cfg.flow).eval(), HiFTGenerator(cfg.hift).eval()
    load_into(flow, ref_flow.state_dict(), "flow")
    load_into(hift, ref_hift.state_dict(), "hift")
    return cfg, ref_flow.to(device), ref_hift.to(device), flow, hift


class Reference:
    """The reference's streaming step for one stream's block (flow_inference.py's token2wav_streaming): the flow over
    prompt + window in streaming mode, then HiFT over the 8 cached mel frames and the block's."""

    def __init__(self, flow, hift, voice, device):
        self.flow, self.hift, self.device = flow, hift, device
        self.prompt = voice.prompt_tokens[None].to(device)
        self.prompt_mel = voice.prompt_mel[None].to(device)
        self.embedding = voice.embedding[None].to(device)

    @torch.inference_mode()
    def block(self, window: list[int], offset: int, finalize: bool = False, with_hift: bool = True):
        tokens = torch.tensor(window, device=self.device)[None]
        mel, _ = self.flow.inference(token=tokens, token_len=torch.tensor([len(window)], device=self.device),
                                     prompt_token=self.prompt, prompt_token_len=torch.tensor([self.prompt.shape[1]], device=self.device),
                                     prompt_feat=self.prompt_mel,
                                     prompt_feat_len=torch.tensor([self.prompt_mel.shape[1]], device=self.device),
                                     embedding=self.embedding, streaming=True, finalize=finalize)
        mel = mel[:, :, offset * 4 :]
        if not with_hift:
            return mel
        cache = torch.zeros(1, 80, 8, device=self.device)  # the mel cache the reference keeps from the block before
        wav, _ = self.hift.inference(speech_feat=torch.cat([cache, mel], dim=2))
        return wav.cpu()


def states(voice, n: int, window: int, block: int, lookahead: int, vocab: int, seed: int) -> list[FlowState]:
    """n streams each with a block due whose window is `window` tokens (the block and its look-ahead included)."""
    g = torch.Generator().manual_seed(seed)
    return [FlowState(voice, tuple(torch.randint(0, vocab, (window,), generator=g).tolist()), 0, window - block - lookahead)
            for _ in range(n)]


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--preset", default="moss-speech", choices=list(PRESETS), help="tiny: a CPU smoke run of this script")
    p.add_argument("--streams", default="8,32,64,128")
    p.add_argument("--prompt-tokens", type=int, default=40, help="the voice's prompt (40: 3.2 s, as the moss-speech preset's)")
    p.add_argument("--context", type=int, default=40, help="tokens a saturated block's window holds (the reference's 40)")
    p.add_argument("--max-batch", type=int, default=16, help="streams per call of ours (the vocoder worker's --max-batch)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json")
    args = p.parse_args()
    device = torch.device(args.device)
    cfg, ref_flow, ref_hift, flow, hift = build(device, args.preset)
    vocab, H = cfg.flow.vocab_size, cfg.hift.nb_harmonics + 1
    voice = random_voice(cfg.flow, prompt_tokens=args.prompt_tokens, seed=3)
    ref = Reference(ref_flow, ref_hift, voice, device)
    out = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "prompt_tokens": args.prompt_tokens, "context": args.context, "max_batch": args.max_batch}

    # ---- correctness: ours float32 eager, and ours as served, against the reference -----------------------
    eager = FlowTokenDecoder(CausalMaskedDiffWithXvec(cfg.flow).eval(), device, dtype=torch.float32, graphs=False)
    eager.flow.load_state_dict(flow.state_dict())
    # bf16, graphs on CUDA, the voice's prompt prefix solved once; windows as the reference decodes them (each call
    # here is a window of its own, not a stream's next blocks: bench/codec_history.py measures a stream history)
    served = FlowTokenDecoder(flow, device, history_streams=0)
    served.set_voices([voice])
    t = time.perf_counter()
    served.warm_up([voice], args.max_batch)
    out["flow_graphs"], out["flow_warm_up_s"] = len(served.graphs), time.perf_counter() - t
    # A saturated window (the reference's max_token_len): `context` tokens, the block and its look-ahead among them.
    [state] = states(voice, 1, args.context, served.block, served.lookahead, vocab, seed=1)
    window = list(state.tokens)
    want = ref.block(window, state.decoded, with_hift=False)[0]
    got_fp32 = eager.decode_chunks([([], state)])[0][0]
    got_bf16 = served.decode_chunks([([], state)])[0][0]
    out["flow_fp32_max_abs_diff"] = float((got_fp32 - want).abs().max())
    out["flow_bf16_snr_db"] = snr_db(want, got_bf16)
    ratio = cfg.flow.token_mel_ratio
    peer = ServedReference(ref_flow, voice, device)
    out["served_reference_bf16_snr_db"] = snr_db(want, peer([window])[0][:, state.decoded * ratio :])
    mel = want[None]
    torch.manual_seed(5)  # the reference's source draws, replayed for ours: initial phases, then the noise
    ref_wav, _ = ref_hift.inference(speech_feat=mel)
    torch.manual_seed(5)
    torch.rand(1, H, device=device)
    noise = torch.randn(1, mel.shape[2] * 480, H, device=device)
    ours_wav = hift.to(device)(mel, noise=noise)[:, 0]
    out["hift_fp32_max_abs_diff"] = float((ref_wav - ours_wav).abs().max())
    hift_runner = GeneratorRunner(HiFTGenerator(cfg.hift).eval(), 480, device, fuse=False, channels_last=False,
                                  cond_dtypes=(torch.float32, torch.long, torch.long, torch.long), cond_shapes=((H,), (), (), ()))
    hift_runner.generator.load_state_dict(hift.state_dict())
    left, _ = receptive_field(cfg.hift)
    hift_runner.warm_up((1, 2, 3, 4, 6, 8, 12, 16))
    print(f"correctness: flow fp32 vs reference max |diff| {out['flow_fp32_max_abs_diff']:.2e}; HiFT fp32 vs reference "
          f"max |diff| {out['hift_fp32_max_abs_diff']:.2e}; flow bf16 (graphs) vs "
          f"reference SNR {out['flow_bf16_snr_db']:.1f} dB; {out['flow_graphs']} flow graphs in {out['flow_warm_up_s']:.1f} s; "
          f"the reference served (bf16, graphs) vs itself in float32 SNR {out['served_reference_bf16_snr_db']:.1f} dB", flush=True)

    bigvgan_h = gen.preset_config("moss-speech" if args.preset == "moss-speech" else "tiny")
    bigvgan = GeneratorRunner(gen.build_generator(bigvgan_h, seed=0), 480, device)
    bigvgan.warm_up((1, 2, 3, 4, 6, 8, 12, 16))
    from services.vocoder.receptive_field import receptive_field as bigvgan_field
    bigvgan_left = bigvgan_field(bigvgan_h)[0]

    def hift_windows(mels, first: bool):
        """Our HiFT over each stream's window (left context but at a stream's start, lookahead held back)."""
        windows = [m if first else torch.cat([torch.randn(80, left, device=device) - 6, m], 1) for m in mels]
        conds = [(torch.zeros(H), torch.tensor(0 if first else left), torch.tensor(w.shape[1] - DEFAULT_LOOKAHEAD),
                  torch.tensor(0)) for w in windows]
        return hift_runner(windows, None, conds)

    def bigvgan_windows(mels, first: bool):
        windows = [m if first else torch.cat([torch.randn(80, bigvgan_left, device=device) - 6, m], 1) for m in mels]
        return bigvgan(windows)

    # ---- first chunk: a stream's first block → samples on the host ----------------------------------------------
    first = served.first_block(voice)
    g = torch.Generator().manual_seed(2)
    first_tokens = torch.randint(0, vocab, (first + 3,), generator=g).tolist()
    fresh = FlowState(voice, tuple(first_tokens), 0, 0)
    cells = {}
    cells["reference flow + HiFT"] = median_time(lambda: ref.block(first_tokens, 0), args.reps, device)
    cells["ours flow + HiFT"] = median_time(lambda: hift_windows([served.decode_chunks([([], fresh)])[0][0]], True), args.reps, device)
    cells["ours flow + BigVGAN"] = median_time(lambda: bigvgan_windows([served.decode_chunks([([], fresh)])[0][0]], True),
                                         args.reps, device)
    cells["ours flow"] = median_time(lambda: served.decode_chunks([([], fresh)])[0][0].cpu(), args.reps, device)
    cells["reference flow"] = median_time(lambda: ref.block(first_tokens, 0, with_hift=False).cpu(), args.reps, device)
    cells["served reference flow"] = median_time(lambda: peer([first_tokens]).cpu(), args.reps, device)
    out["first_chunk_ms"] = {k: v * 1e3 for k, v in cells.items()}
    out["first_block_tokens"] = first
    for k, v in out["first_chunk_ms"].items():
        print(f"first chunk ({first} + 3 tokens): {k:24s} {v:8.2f} ms", flush=True)

    # ---- aggregate: every stream with a saturated block due --------------------------------------------------
    ref_block = median_time(lambda: ref.block(window, state.decoded), max(3, args.reps // 2), device)
    ref_flow_block = median_time(lambda: ref.block(window, state.decoded, with_hift=False).cpu(), max(3, args.reps // 2), device)
    out["reference_block_ms"], out["reference_flow_block_ms"] = ref_block * 1e3, ref_flow_block * 1e3
    out["streams"] = {}
    for n in (int(s) for s in args.streams.split(",")):
        streams = states(voice, n, args.context, served.block, served.lookahead, vocab, seed=10 + n)
        calls = [streams[i : i + args.max_batch] for i in range(0, n, args.max_batch)]

        def flow_only():
            return [m for call in calls for m, _ in served.decode_chunks([([], s) for s in call])]

        def with_hift():
            for call in calls:
                hift_windows([m for m, _ in served.decode_chunks([([], s) for s in call])], False)

        def with_bigvgan():
            for call in calls:
                bigvgan_windows([m for m, _ in served.decode_chunks([([], s) for s in call])], False)

        def served_reference_flow():
            return [peer([list(s.tokens) for s in call])[:, :, call[0].decoded * ratio :].cpu() for call in calls]

        audio = n * BLOCK_SECONDS
        cell = {"served_reference_flow_x_realtime": audio / median_time(served_reference_flow, max(3, args.reps // 2), device),
                "ours_flow_hift_x_realtime": audio / median_time(with_hift, max(3, args.reps // 2), device),
                "ours_flow_bigvgan_x_realtime": audio / median_time(with_bigvgan, max(3, args.reps // 2), device),
                "ours_flow_x_realtime": audio / median_time(lambda: [m.cpu() for m in flow_only()], max(3, args.reps // 2), device),
                "reference_flow_hift_x_realtime": BLOCK_SECONDS / ref_block,
                "reference_flow_x_realtime": BLOCK_SECONDS / ref_flow_block}
        out["streams"][n] = cell
        print(f"{n} streams: ours flow+HiFT {cell['ours_flow_hift_x_realtime']:.0f}x real time, flow+BigVGAN "
              f"{cell['ours_flow_bigvgan_x_realtime']:.0f}x, flow {cell['ours_flow_x_realtime']:.0f}x; reference flow+HiFT "
              f"{cell['reference_flow_hift_x_realtime']:.1f}x, flow {cell['reference_flow_x_realtime']:.1f}x, served flow "
              f"{cell['served_reference_flow_x_realtime']:.0f}x", flush=True)

    print(f"\n{out['gpu']}, torch {out['torch']}, {out['date']}; voice prompt {args.prompt_tokens} tokens, "
          f"window {args.context} tokens, calls of {args.max_batch}")
    print(f"{'cell':34s} {'reference':>12s} {'ref. served':>12s} {'ours':>12s} {'vs ref.':>8s} {'vs served':>10s}")
    fc = out["first_chunk_ms"]

    def row(what: str, ref_v, served_v, ours_v, lower_is_better: bool):
        """One line: the two references, ours, and how many times better ours is than each."""
        def better(other, width: int) -> str:
            if other is None:
                return f"{'-':>{width}s}"
            return f"{(other / ours_v if lower_is_better else ours_v / other):{width - 1}.1f}x"
        cols = [f"{v:12.2f}" if v is not None else f"{'':12s}" for v in (ref_v, served_v, ours_v)]
        print(f"{what:34s} {' '.join(cols)} {better(ref_v, 8)} {better(served_v, 10)}")

    row("first chunk flow+HiFT (ms)", fc["reference flow + HiFT"], None, fc["ours flow + HiFT"], True)
    row("first chunk flow (ms)", fc["reference flow"], fc["served reference flow"], fc["ours flow"], True)
    row("first chunk flow+BigVGAN (ms)", None, None, fc["ours flow + BigVGAN"], True)
    for n, c in out["streams"].items():
        row(f"{n} streams flow+HiFT (x real time)", c["reference_flow_hift_x_realtime"], None, c["ours_flow_hift_x_realtime"], False)
        row(f"{n} streams flow (x real time)", c["reference_flow_x_realtime"], c["served_reference_flow_x_realtime"],
            c["ours_flow_x_realtime"], False)
        row(f"{n} streams flow+BigVGAN (x real time)", None, None, c["ours_flow_bigvgan_x_realtime"], False)
    s64 = out["streams"].get(64)
    if s64:
        r = s64["ours_flow_x_realtime"] / s64["reference_flow_x_realtime"]
        print(f"target: {'PASS' if r >= 5 else 'MISS'} flow at 64 streams >= 5x the reference's eager aggregate: {r:.1f}x; "
              f"against the reference served: {s64['ours_flow_x_realtime'] / s64['served_reference_flow_x_realtime']:.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
