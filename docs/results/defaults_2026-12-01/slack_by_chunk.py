#!/usr/bin/env python3
"""Each chunk's slack at the client by its place in the stream (bench.json of `moss-serve bench`): when it arrived
against when its listener, playing from the first chunk's arrival, ran out of audio. Chunks 6 and later together.
  python3 slack_by_chunk.py <bench.json>..."""
import json, sys, collections
import numpy as np
for path in sys.argv[1:]:
    d = json.load(open(path)); lv = next(iter(d['levels'].values()))
    by = collections.defaultdict(list); allv = []
    for s in lv['streams']:
        if s['code'] != 'OK' or not s['chunk_arrivals_s']: continue
        a = s['chunk_arrivals_s']; n = s['chunk_samples']; t0 = a[0]; played = 0
        for i in range(1, len(a)):
            played += n[i-1]; due = t0 + played / s['sample_rate']; sl = due - a[i]
            by[min(i, 6)].append(sl); allv.append(sl)
    allv = np.array(allv)
    print(path, 'chunks', len(allv), 'p2 %.0f ms' % (1e3*np.quantile(allv, .02)), 'min %.0f' % (1e3*allv.min()))
    for i in sorted(by):
        v = np.array(by[i]); low = (v < 0.05).sum()
        print(f'  chunk {i}{"+" if i == 6 else ""}: n {len(v)}, p2 {1e3*np.quantile(v,.02):.0f} ms, p10 {1e3*np.quantile(v,.1):.0f}, p50 {1e3*np.median(v):.0f}, under 50 ms: {low} ({100*low/len(allv):.2f}% of all)')
