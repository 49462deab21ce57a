#!/usr/bin/env bash
# Call 6's flow calls were 5-15% slower than the journal's (another machine's run), though the encoder alone was faster.
# Side by side on one machine: bench/codec_history.py at 1 and 32 streams with the conformer before the change
# (.whl/inputs/conformer_before.py, the file at d66fb62) and after, alternated twice.
#   bash docs/results/voices_spoken_2026-11-29/call7.sh
# Predicted (2026-11-29 20:38 UTC): after faster than before by ~0.1 ms at 1 stream and ~0.9 ms at 32 steady (the
# encoder's 6.33 -> 5.45 ms at 32 x 80 is smaller in a call whose rows are 32 x 80 only in part); run-to-run +-1 ms.
source bench/wheel_site.sh
cp services/vocoder/codec/conformer.py "$SITE/conformer_after.py"
for round in 1 2; do
  for which in before after; do
    if [ $which = before ]; then cp .whl/inputs/conformer_before.py services/vocoder/codec/conformer.py
    else cp "$SITE/conformer_after.py" services/vocoder/codec/conformer.py; fi
    echo "== $which, round $round"
    timeout 120 python3 bench/codec_history.py --streams 1,32 --modes history 2>&1 | grep -E "^per-block" | tail -4
  done
done
