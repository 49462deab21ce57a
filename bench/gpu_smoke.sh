#!/usr/bin/env bash
# One call on a lent GPU machine (see docs/benchmarks.md). Expects the missing wheels in .whl/ (bench/wheels.sh: grpcio,
# grpcio-health-checking, grpcio-reflection 1.85.1, protobuf 7, googleapis-common-protos, bigvgan and its
# inference imports).
#   bash bench/gpu_smoke.sh            # GPU tests (kernels, kernel runner, graphs, sampler, the codec, the encoder), then the benchmark
#   bash bench/gpu_smoke.sh tests      # only the GPU tests (over 400 s with the parity oracle's wheels: a device
#                                      # call of 10 minutes may not hold them; then tests-llm, tests-codec,
#                                      # tests-vocoder-encoder and tests-flow-kernels, a call each)
#   bash bench/gpu_smoke.sh bench      # only the benchmark
#   bash bench/gpu_smoke.sh suite      # the whole test suite on the GPU image
source "$(dirname "$0")/wheel_site.sh"
what=${1:-all}
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
LLM_TESTS=(tests/test_paged_attention.py tests/test_fused_kernels.py tests/test_kernel_runner.py tests/test_fp8.py
           tests/test_sampler.py tests/test_overlap.py tests/test_text_skip.py tests/test_pacing.py tests/test_gpu_share.py)
# the codec's flow (its kernels, parity with the reference: carry bench/wheels.sh --parity's wheels, streaming, the
# history, the solve, graph capture); then the waveform generators and the encoder. One list took over 320 s on a cold
# H200 (2026-12-02: ~225 of its tests), so each is a call of its own.
CODEC_TESTS=(tests/test_chunk_attention.py tests/test_frame_ops.py tests/test_fused_linear.py tests/test_codec_parity.py
             tests/test_codec_prefix.py tests/test_codec_stream.py tests/test_codec_history.py tests/test_codec_solve.py
             tests/test_solve_worker.py tests/test_vocoder_capture.py)
VOCODER_ENCODER_TESTS=(tests/test_vocoder_activation.py tests/test_vocoder_stream.py tests/test_vocoder_worker.py
                       tests/test_pipelined_worker.py tests/test_hift_snake.py tests/test_encoder_attention.py tests/test_encoder_model.py
                       tests/test_encoder_graphs.py tests/test_encoder_stream.py tests/test_encoder_worker.py)
# the flow's own Triton kernels at the real size (the products that load their weights before the wait, with the
# folds; the megakernel, off by default; every kernel compiled): ~200-300 s on a fresh H200, its Triton cache cold
# (2026-11-30: test_prefetch_linear over 120 s cold, the megakernel's 57-132 s, kernel_compile 32 s)
FLOW_KERNEL_TESTS=(tests/test_prefetch_linear.py tests/test_megakernel.py tests/test_kernel_compile.py)
run_tests() {  # $1: the log's name; then the files
  local log=$1; shift
  echo "== GPU tests: $log"
  python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/$log.log" | tail -25
}
[[ $what == all || $what == tests || $what == tests-llm ]] && run_tests gpu_tests_llm "${LLM_TESTS[@]}"
[[ $what == all || $what == tests || $what == tests-codec ]] && run_tests gpu_tests_codec "${CODEC_TESTS[@]}"
[[ $what == all || $what == tests || $what == tests-vocoder-encoder ]] && \
  run_tests gpu_tests_vocoder_encoder "${VOCODER_ENCODER_TESTS[@]}"
[[ $what == all || $what == tests || $what == tests-flow-kernels ]] && run_tests gpu_tests_flow_kernels "${FLOW_KERNEL_TESTS[@]}"
if [[ $what == suite ]]; then
  echo "== whole suite"
  python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tee "$OUT/suite.log" | tail -25
fi
if [[ $what == all || $what == bench ]]; then
  echo "== llm engine benchmark"
  python3 bench/llm_engine.py --preset moss-speech --device cuda --json "$OUT/llm_engine.json" 2>&1 | tee "$OUT/llm_engine.log" | tail -40
fi
