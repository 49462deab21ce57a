#!/usr/bin/env bash
# Written 2026-12-02 ~04:00 UTC, before this run: the estimator's attention with every key of a program in one loop
# (chunk_attention.ONE_LOOP), by tile configuration at the real shapes, then in the flow's steady calls.
#   bash docs/results/calls_2026-12-02/call9.sh
#
# Why (call5's profile, docs/benchmarks.md 2026-12-02): attention is 27% of a steady call's kernel time at 32 streams,
# 26.9 us a call, for ~1.8 GFLOP (a few us at the bf16 rate) and ~21 MB of distinct q, k, v and output. Its programs
# (16 queries, one warp) walk ~10 blocks of 16 keys in three loops of 3-4 blocks (the prefix's, the ring's, the row's
# own), each pipelined apart (the sm_90 compile: 32 cp.async a loop), so each loop's first blocks wait on their loads.
# One loop over the three sources' blocks end to end keeps the pipeline full across them. Same blocks in the same
# order, so the same sums.
# Predicted: codec_kernels.py, "history 32": the default (16x16 w1, three loops) 22-28 us; 16x16 w1 one s3 15-21 us
# (20-35% less); s4 within ±10% of s3; the three loops at s4 or s2 within ±5% of s3. "history 16": one loop 10-25%
# less than its default. Few programs (history 1-6: keys in parts) unchanged, ONE_LOOP does not apply there. Every
# cell's max abs error against PyTorch's form as the default's. codec_flow_profile.py: the steady call at 32 streams
# 61.6 → 55-59 ms in graphs with attention-one-loop, attention's kernel time 15.1 → 9-12 ms; 16 streams 46.9 → 43-46
# ms; the mel's SNR against the defaults over 100 dB (the same sums). Wrong if one loop is no faster: then the loads'
# latency is not what holds a program, and the next step is fewer programs reading each key (a row's queries in one).
# The norms (frame_norm: 1,410 launches of 5.8 us at 32 streams, 15%; ~8-10 MB moved each, ~3 us of bandwidth; 320
# programs of 16 frames and 4 warps, ~10 warps a multiprocessor): norm-rows-8 and norm-rows-4 (640 and 1,280
# programs) 4-5 us a norm, the steady call at 32 streams 1-3 ms faster; norm-rows-32 0.5-1.5 ms slower; norm-warps-8
# within ±1 ms; a first call within ±0.3 ms for every norm variant (290 norms of 2.9 us; but a later decoder's first
# call measured slower whatever its variant, codec_flow_profile.py's --variants help). Every SNR over 100 dB.
set -uo pipefail
mkdir -p "${OUT:-/tmp/out}"
timeout 170 python3 bench/studies/codec_kernels.py --json "${OUT:-/tmp/out}/attention_tiles.json" 2>&1 | tail -12
timeout 380 python3 bench/studies/codec_flow_profile.py --streams 16,32 \
  --variants defaults,attention-one-loop,norm-rows-8,norm-rows-4,norm-warps-8,norm-rows-32 \
  --json "${OUT:-/tmp/out}/flow_profile_variants.json" > "${OUT:-/tmp/out}/flow_profile_variants.log" 2>&1
# (each cell's line is printed as it is measured: read whatever came before a timeout)
grep -E "SNR vs the first variant|^eager:|_chunk_attention|_frame_norm" "${OUT:-/tmp/out}/flow_profile_variants.log"
# Run 2026-12-02 12:42 UTC at 027fc2a: one loop 1.5x slower, the norms' shapes within noise (docs/benchmarks.md,
# sustained-2026-12-02). The one-loop path and its `attention-one-loop` variant were removed after it.
