"""Where the slowest first audio goes: the bench's per-stream stages (bench.json), by TTFA band. "rest" is TTFA less the
llm's first chunk at the gateway and the vocoder's compute for it: mostly the first chunk's wait for a vocoder call."""
import json
import sys

import numpy as np

for path in sys.argv[1:]:
    levels = json.load(open(path))["levels"]
    for name, level in levels.items():
        s = [x["stages"] for x in level["streams"] if x["code"] == "OK"]
        get = lambda k: np.array([x.get(k, np.nan) for x in s]) * 1000  # noqa: E731
        ttfa, llm, voc = get("ttfa_seconds"), get("llm_first_chunk_seconds"), get("vocoder_first_chunk_seconds")
        rest = ttfa - llm - voc
        queue, inside = get("vocoder_first_chunk_queue_seconds"), get("vocoder_first_chunk_in_vocoder_seconds")
        order = np.argsort(ttfa)
        print(f"{path} {name}: {len(s)} ok, TTFA p50/p95 {np.percentile(ttfa, 50):.0f}/{np.percentile(ttfa, 95):.0f} ms")
        for band, idx in (("all", order), ("fastest half", order[: len(s) // 2]), ("slowest tenth", order[-len(s) // 10:])):
            print(f"  {band:14s} ttfa {ttfa[idx].mean():6.1f}  llm {llm[idx].mean():6.1f}  vocoder {voc[idx].mean():5.1f}"
                  f"  rest {rest[idx].mean():5.1f} (vocoder queue {np.nanmean(queue[idx]):5.1f}, vocoder's span"
                  f" {np.nanmean(inside[idx]):5.1f}) ms")
