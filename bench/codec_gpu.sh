#!/usr/bin/env bash
# One call on a lent GPU machine for the codec decoder (issue 20): its tests on CUDA, the decoder against the
# reference run eagerly (bench/codec.py), and streamed-vs-offline agreement at the real size (bench/codec_seams.py).
# Expects the wheels of bench/gpu_smoke.sh in .whl/, plus the reference (test oracle and peer): cosyvoice2-eu
# 0.2.8, conformer 0.3.2, diffusers and importlib_metadata (docs/benchmarks.md lists the download command).
#   bash bench/codec_gpu.sh
source "$(dirname "$0")/wheel_site.sh"
echo "== codec tests on CUDA"
python3 -m pytest -q -p no:cacheprovider tests/test_codec_parity.py tests/test_codec_stream.py \
  tests/test_vocoder_stream.py tests/test_vocoder_worker.py 2>&1 | tee "$OUT/codec_tests.log" | tail -8
echo "== the codec decoder against the reference"
python3 bench/codec.py --device cuda --json "$OUT/codec.json" 2>&1 | tee "$OUT/codec.log" | grep -v Warning
echo "== streamed vs offline at the real size"
python3 bench/codec_seams.py --preset moss-speech --device cuda --json "$OUT/codec_seams.json" 2>&1 \
  | grep -v -i "warn" | tee "$OUT/codec_seams.log"
