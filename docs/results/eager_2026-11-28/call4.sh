#!/usr/bin/env bash
# The review mend 63f4afa (a history call's batch bucket looked up once; the vocoder server's workers listed once) on
# a GPU: the codec files whose GPU tests reach those lines (the stream history's calls, graphed and eager once serving,
# the stream tests, the vocoder's worker and stream tests).
#   bash docs/results/eager_2026-11-28/call4.sh
#
# Predicted (written 2026-11-28 18:39 UTC, before the call; an H200): every test passes, as in call 2 (no behaviour
# changed).
set -uo pipefail
source bench/wheel_site.sh
python3 -m pytest -q -p no:cacheprovider tests/test_codec_history.py tests/test_codec_stream.py tests/test_vocoder_stream.py \
  tests/test_vocoder_worker.py tests/test_codec_solve.py tests/test_solve_worker.py 2>&1 | tail -3
