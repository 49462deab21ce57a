#!/usr/bin/env bash
# Written 2026-12-01 ~05:50 UTC with call5.sh, before either ran: one stream again with the share fixed at 25%
# (--no-mps-llm-follows-load), 24 turns, the comparison for call5.
#   bash docs/results/llm_share_2026-12-01/call6.sh
#
# Predicted: TTFA p50 84-90 ms (call4: 86.5), the llm's first chunk 60-64 ms.
set -uo pipefail
ARM=off N=6 REQUESTS=24 RAMP=0 timeout 300 bash docs/results/llm_share_2026-12-01/arm.sh
