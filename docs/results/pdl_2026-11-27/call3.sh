#!/usr/bin/env bash
# Call 3 (H100), at b872f83: the GPU tests after the decoder's split (its graphs in flow_graphs.py) with PDL on, then
# the flow against its floor (bench/codec_history.py) and against the reference run eagerly (bench/codec.py).
set -uo pipefail
SITE=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE .whl/*.whl
export PYTHONPATH=$SITE:$PWD:$PWD/protos:$PWD/bench PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1
echo "== GPU tests"
timeout 230 python3 -m pytest -q -p no:cacheprovider tests/test_fused_linear.py tests/test_frame_ops.py tests/test_chunk_attention.py \
  tests/test_codec_parity.py tests/test_codec_stream.py tests/test_codec_history.py tests/test_codec_prefix.py tests/test_codec_solve.py \
  tests/test_solve_worker.py tests/test_vocoder_worker.py tests/test_hift_snake.py 2>&1 | tee $OUT/gpu_tests.log | tail -3
echo "== codec_history"
timeout 120 python3 bench/codec_history.py --streams 1,16,32 --json $OUT/codec_history.json > $OUT/codec_history.log 2>&1; tail -12 $OUT/codec_history.log
echo "== codec (peer)"
timeout 200 python3 bench/codec.py --device cuda --streams 8,64 --reps 3 --json $OUT/codec_peer.json > $OUT/codec_peer.log 2>&1; tail -14 $OUT/codec_peer.log
