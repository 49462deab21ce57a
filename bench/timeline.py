"""Samples the stack's gauges and busy counters every half second into a TSV, until killed (bench/overload.sh runs
it beside each gateway's loads): the gateway's admission limit, turns running and queued, and the llm's and the
vocoder's running sums of their steps' and calls' time, so that bench/overload_report.py can tell how busy each stage
was over a load and from one half second to the next, not only over the whole load.

    python3 bench/timeline.py OUT.tsv GATEWAY_METRICS_PORT [LLM_METRICS_PORT VOCODER_METRICS_PORT]
"""

from __future__ import annotations

import re
import sys
import time
import urllib.request

GATEWAY = ("gateway_admission_limit", "gateway_active_requests", "gateway_queued_turns")
LLM = ("llm_step_seconds_sum", "llm_step_seconds_count", "llm_batch_size_sum", "llm_paced_seconds_total")
VOCODER = ("vocoder_batch_seconds_sum", "vocoder_batch_seconds_count", "vocoder_batch_size_sum",
           "vocoder_audio_seconds_total")
# The first-chunk lane's calls, among the vocoder's (sampled since 2026-12-01: older timelines lack them)
LANE = ("vocoder_lane_batch_seconds_sum", "vocoder_lane_batch_seconds_count", "vocoder_lane_batch_size_sum")
# The two parts of every call, their device time on CUDA: the flow (tokens to mel) and the generator (mel to samples)
# (sampled since 2026-12-02: older timelines lack them)
CALL_PARTS = ("vocoder_token_decode_seconds_sum", "vocoder_generate_seconds_sum")
INTERVAL = 0.5


def samples(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """The named unlabelled samples found in a Prometheus text page (bench/overload_report.py reads its scrapes so too)."""
    found = {name: re.search(rf"^{name} (\S+)$", text, re.M) for name in names}
    return {name: float(m.group(1)) for name, m in found.items() if m}


def scrape(port: str) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            return r.read().decode()
    except OSError:
        return ""  # a stage restarting: its columns stay empty for this row


def main(argv: list[str]) -> int:
    path, ports = argv[1], argv[2:]
    sources = list(zip(ports, (GATEWAY, LLM, VOCODER + LANE + CALL_PARTS)))
    with open(path, "a") as out:
        out.write("\t".join(["t", *(n for _, names in sources for n in names)]) + "\n")
        while True:
            t = time.time()
            row = []
            for port, names in sources:
                page = samples(scrape(port), names)
                row += [repr(page[n]) if n in page else "" for n in names]
            out.write(f"{t:.2f}\t" + "\t".join(row) + "\n")
            out.flush()
            time.sleep(max(0.0, t + INTERVAL - time.time()))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
