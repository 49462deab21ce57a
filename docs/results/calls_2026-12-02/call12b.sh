#!/usr/bin/env bash
# The command of 2026-12-02 ~15:35 UTC (device clock), written here after its run: call12's tests-codec had run out of
# its time limit at 60% (~225 passed, none failed), so the flow's tests that take the small tile, with the parity
# oracle's wheels (bench/wheels.sh --parity). No prediction was written before it.
source bench/wheel_site.sh >/dev/null
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_codec_history.py tests/test_codec_parity.py \
  tests/test_codec_stream.py tests/test_vocoder_capture.py tests/test_codec_prefix.py 2>&1 | tee $OUT/codec_tests.log | tail -8
