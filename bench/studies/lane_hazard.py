"""The first-chunk lane's allocator hazard, with streamer.used_here and without it (patched out), on a CUDA GPU.

A stream's first chunk runs on the lane's CUDA stream, its next on the playing worker's, queued there behind a long
kernel (a large call); meanwhile the lane takes memory for its next first chunks and fills it (here with NaN). Without
used_here the caching allocator may give the lane the block of the stream's kept mel frames, freed by the playing
worker before its queued copy of them ran: the stream's frames then read NaN. Each trial counts as corrupted when the
stream's first frames differ from what they were. tests/test_vocoder_stream.py asserts the case with used_here; this
shows that the case without it goes wrong, so that the test can fail. (The stand-in decoder copies from pageable host
memory, which waits for the device, so its window is short; the codec's flow copies through pinned memory, no wait.)

  python3 bench/studies/lane_hazard.py --trials 20 --json lane_hazard.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import numpy as np
import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "protos")]

from services.vocoder import streamer as streamer_module  # noqa: E402
from services.vocoder.loader import load_vocoder  # noqa: E402
from services.vocoder.streamer import MelStreamer  # noqa: E402

SLEEP_CYCLES = 500_000_000  # ~0.3 s of the playing stream busy


def trial(vocoder, lane: torch.cuda.Stream, seed: int) -> bool:
    """One stream's first chunk on the lane, its next on the current stream behind a long kernel → corrupted?"""
    codes = np.random.default_rng(seed).integers(0, vocoder.codebook_size, 40).tolist()
    s = MelStreamer(vocoder)
    with torch.cuda.stream(lane):
        s.prepare(codes[:20])
    lane.synchronize()
    first = s.mel.clone()
    torch.cuda._sleep(SLEEP_CYCLES)
    s.prepare(codes[20:])
    with torch.cuda.stream(lane):
        junk = [torch.full_like(first, float("nan")) for _ in range(16)]
    torch.cuda.synchronize()
    del junk
    return not torch.equal(s.mel[:, : first.shape[1]], first)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="tiny,tiny-codec")
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--json")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("lane_hazard: needs a CUDA GPU (two CUDA streams)")
    rows = []
    kept = streamer_module.used_here
    for preset in args.presets.split(","):
        vocoder = load_vocoder(None, preset, "cuda")
        lane = torch.cuda.Stream()
        trial(vocoder, lane, 0)  # the calls' graphs captured first: a capture waits for the device, closing the race
        for fixed in (True, False):
            streamer_module.used_here = kept if fixed else (lambda *tensors: None)
            try:
                bad = sum(trial(vocoder, lane, seed) for seed in range(args.trials))
            finally:
                streamer_module.used_here = kept
            rows.append(dict(preset=preset, used_here=fixed, trials=args.trials, corrupted=bad))
    print(f"{'preset':<12} {'used_here':<9} {'corrupted':>9}")
    for r in rows:
        print(f"{r['preset']:<12} {'on' if r['used_here'] else 'off':<9} {r['corrupted']:>4} of {r['trials']}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(date=datetime.date.today().isoformat(),
                                                   device=torch.cuda.get_device_name(), rows=rows), indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
