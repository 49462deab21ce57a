"""Compile every Triton kernel of the project for an H100 (sm_90) without a GPU: triton.compile down to
PTX and cubin with the ptxas that ships in the triton wheel. The CPU interpreter runs the kernels' math
in the tests; only the compiler sees what it refuses (globals that are not constexpr, type mixes, ...).
Run by tests/test_kernel_compile.py in a fresh process (the interpreter must be off when the kernels
are defined). Prints one line per kernel; exits 1 if any fails."""

from __future__ import annotations

import os
import sys
import traceback

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from services.encoder import attention as encoder_attention  # noqa: E402
from services.llm.runner.kernels import fp8, fused, paged_attention, sampling  # noqa: E402
from services.vocoder import activation  # noqa: E402
from services.vocoder.codec import chunk_attention, frame_ops, fused_linear, megakernel, prefetch_linear, snake  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


def signature(kernel, ptrs: dict[str, str], floats=(), constexprs: dict | None = None) -> tuple[dict, dict]:
    """Every argument of `kernel`: a pointer of the given dtype, a float32, a constexpr, or else an int32."""
    constexprs = constexprs or {}
    sig = {}
    for name in kernel.arg_names:
        sig[name] = "constexpr" if name in constexprs else ptrs.get(name) or ("fp32" if name in floats else "i32")
    return sig, constexprs


BF16 = "*bf16"
ATTENTION_PTRS = {"Q": BF16, "K": BF16, "V": BF16, "KP": BF16, "VP": BF16, "KH": BF16, "VH": BF16, "O": BF16,
                  "ML": "*fp32", "ACC": "*fp32", "PART_ML": "*fp32", "PART_ACC": "*fp32",
                  "ROWS": "*i64", "HROWS": "*i64", "COUNT": "*i64", "LENGTHS": "*i32"}
FRAME_NORM_PTRS = {"H": BF16, "W1": BF16, "B1": BF16, "ROW_TERMS": BF16, "RES": BF16, "W2": BF16, "B2": BF16,
                   "OUT": BF16, "OUT2": BF16, "K": BF16, "V": BF16, "KR": BF16, "VR": BF16, "KEEP_ROWS": "*i64",
                   "AT": "*i64", "LENGTHS": "*i32"}
PREFETCH_PTRS = {**FRAME_NORM_PTRS, "X": BF16, "W": BF16, "BIAS": BF16, "GAMMA": BF16, "BETA": BF16, "FRAMES": BF16,
                 "LEFT_ROWS": "*i64", "LEFT_KEEP": "*i64", "LEFT_LENGTHS": "*i32", "OUT": BF16}
ATTN = dict(GROUP=4, HEAD_DIM=128, BLOCK_SIZE=16)


def prefetch(warps: int, **constexprs) -> tuple:
    """A KERNELS entry of prefetch_linear's kernel: a plain product of K 256 in 16 x 16 tiles, but for `constexprs`."""
    base = dict(HAS_BIAS=True, GELU=False, NORM=False, RESIDUAL=False, KEEP=False, HEADS=1, HEAD_D=1, HEADS_HERE=1,
                TAPS=0, LEFT=False, KEEP_LEFT=False, IEEE=False, CHUNK=256, CHUNKS=1, BLOCK_M=16, BLOCK_N=16, PDL=True)
    kernel = prefetch_linear._prefetch_linear
    return (kernel, *signature(kernel, PREFETCH_PTRS, ("eps",), base | constexprs), warps)


MEGAKERNEL = "codec: a level's transformer blocks, persistent (megakernel.py)"
# the small tile a steady call of 6 streams or more takes (16 x 16, one warp, the max kept lazily, at most 96 registers:
# chunk_attention.SMALL_TILE), and the same tile rescaling every block: tests/test_kernel_compile.py counts the
# instructions of their walks' inner loops in the sm_90 code, and the small tile's registers
ATTENTION_EVERY_BLOCK = "codec: static-chunk attention after a stream's history, 16 x 16, every block rescaled"
ATTENTION_SMALL_TILE = "codec: static-chunk attention after a stream's history, the small tile (the max kept lazily)"
OPTIONS = {ATTENTION_SMALL_TILE: {"maxnreg": chunk_attention.SMALL_TILE["maxnreg"]}}  # compiler options beyond warps
KERNELS = {
    "decode partition": (paged_attention._decode_partition_kernel, *signature(
        paged_attention._decode_partition_kernel,
        {"q_ptr": BF16, "kv_ptr": BF16, "table_ptr": "*i32", "ctx_ptr": "*i32", "part_m_ptr": "*fp32",
         "part_l_ptr": "*fp32", "part_acc_ptr": "*fp32", "out_ptr": BF16}, ("qk_scale",),
        dict(ATTN, GROUP_PAD=16, SLICES=4, BLOCK_N=64, PDL=True)), 4),
    "decode partition, one slice": (paged_attention._decode_partition_kernel, *signature(
        paged_attention._decode_partition_kernel,
        {"q_ptr": BF16, "kv_ptr": BF16, "table_ptr": "*i32", "ctx_ptr": "*i32", "part_m_ptr": "*fp32",
         "part_l_ptr": "*fp32", "part_acc_ptr": "*fp32", "out_ptr": BF16}, ("qk_scale",),
        dict(ATTN, GROUP_PAD=16, SLICES=1, BLOCK_N=64, PDL=True)), 4),
    "decode merge": (paged_attention._decode_merge_kernel, *signature(
        paged_attention._decode_merge_kernel,
        {"part_m_ptr": "*fp32", "part_l_ptr": "*fp32", "part_acc_ptr": "*fp32", "ctx_ptr": "*i32", "out_ptr": BF16}, (),
        dict(GROUP=4, GROUP_PAD=16, HEAD_DIM=128, SLICES=4, BLOCK_N=64, PDL=True)), 4),
    "prefill": (paged_attention._prefill_kernel, *signature(
        paged_attention._prefill_kernel,
        {"q_ptr": BF16, "kv_ptr": BF16, "table_ptr": "*i32", "cu_q_ptr": "*i32", "ctx_ptr": "*i32", "out_ptr": BF16},
        ("qk_scale",), dict(ATTN, BLOCK_M=64, BLOCK_N=64, PDL=True)), 4),
    "rms_norm + residual": (fused._rms_norm_kernel, *signature(
        fused._rms_norm_kernel, {"x_ptr": BF16, "res_ptr": BF16, "w_ptr": BF16, "out_ptr": BF16}, ("eps",),
        dict(HAS_RESIDUAL=True, BLOCK=4096, PDL=True)), 8),
    "qk norm + rope + store": (fused._qk_norm_rope_store_kernel, *signature(
        fused._qk_norm_rope_store_kernel,
        {"qkv_ptr": BF16, "qw_ptr": BF16, "kw_ptr": BF16, "pos_ptr": "*i64", "cs_ptr": "*fp32", "kv_ptr": BF16,
         "slot_ptr": "*i64", "q_ptr": BF16}, ("eps",), dict(H=32, KH=8, D=128, HALF_BLOCK=64, H_BLOCK=32, KH_BLOCK=8,
                                                                     PDL=True)),
        8),
    "fp8: a row's quantization": (fp8._quantize_rows_kernel, *signature(
        fp8._quantize_rows_kernel, {"x_ptr": BF16, "q_ptr": "*fp8e4nv", "scale_ptr": "*fp32"}, ("fp8_max", "tiny"),
        dict(BLOCK=4096)), 8),
    "fp8: decode products": (fp8._decode_kernel.fn, *signature(
        fp8._decode_kernel.fn, {"x_ptr": "*fp8e4nv", "xs_ptr": "*fp32", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32",
                                "y_ptr": BF16}, (), dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256)), 4),
    "silu * mul": (fused._silu_mul_kernel, *signature(
        fused._silu_mul_kernel, {"gu_ptr": BF16, "out_ptr": BF16}, (), dict(BLOCK=2048, PDL=True)), 8),
    "sampling: prepare": (sampling._prepare_kernel, *signature(
        sampling._prepare_kernel,
        {"logits_ptr": "*fp32", "seen_ptr": "*u8", "slot_ptr": "*i64", "penalty_ptr": "*fp32",
         "temperature_ptr": "*fp32", "block_eosp_ptr": "*u8", "z_ptr": "*fp32", "greedy_ptr": "*i64", "ok_ptr": "*i8"},
        (), dict(BLOCK=1024)), 4),
    "sampling: pick": (sampling._pick_kernel, *signature(
        sampling._pick_kernel,
        {"z_ptr": "*fp32", "order_ptr": "*i64", "top_k_ptr": "*i64", "top_p_ptr": "*fp32", "temperature_ptr": "*fp32",
         "seed_ptr": "*i64", "step_ptr": "*i64", "greedy_ptr": "*i64", "out_ptr": "*i64"}, (), dict(K=64)), 1),
    "vocoder: anti-aliased snake, [B, C, T]": (activation._anti_aliased_snake_kernel, *signature(
        activation._anti_aliased_snake_kernel,
        {"x_ptr": BF16, "f_ptr": "*fp32", "g_ptr": "*fp32", "alpha_ptr": "*fp32", "inv_beta_ptr": "*fp32",
         "out_ptr": BF16, "scratch_ptr": "*fp32"}, (), dict(BC=4, BT=256, CHANNELS_LAST=False)), 4),
    "vocoder: anti-aliased snake, channels-last": (activation._anti_aliased_snake_kernel, *signature(
        activation._anti_aliased_snake_kernel,
        {"x_ptr": BF16, "f_ptr": "*fp32", "g_ptr": "*fp32", "alpha_ptr": "*fp32", "inv_beta_ptr": "*fp32",
         "out_ptr": BF16, "scratch_ptr": "*fp32"}, (), dict(BC=64, BT=16, CHANNELS_LAST=True)), 4),
    "codec: static-chunk attention with a prompt prefix": (chunk_attention._chunk_attention, *signature(
        chunk_attention._chunk_attention, ATTENTION_PTRS, ("scale",),
        dict(H=8, D=64, HISTORY=False, PARTS=1, PREFIX_PARTS=-1, CASCADE=False, BLOCK_M=64, BLOCK_N=64,
             PRECISION="tf32", PDL=True, LAZY=False)), 4),
    "codec: static-chunk attention after a stream's history": (chunk_attention._chunk_attention, *signature(
        chunk_attention._chunk_attention, ATTENTION_PTRS, ("scale",),
        dict(H=8, D=64, HISTORY=True, PARTS=1, PREFIX_PARTS=-1, CASCADE=False, BLOCK_M=64, BLOCK_N=32,
             PRECISION="tf32", PDL=True, LAZY=False)), 4),
    ATTENTION_EVERY_BLOCK: (chunk_attention._chunk_attention, *signature(
        chunk_attention._chunk_attention, ATTENTION_PTRS, ("scale",),
        dict(H=8, D=64, HISTORY=True, PARTS=1, PREFIX_PARTS=-1, CASCADE=False, BLOCK_M=16, BLOCK_N=16,
             PRECISION="tf32", PDL=True, LAZY=False)), 1),
    ATTENTION_SMALL_TILE: (chunk_attention._chunk_attention, *signature(
        chunk_attention._chunk_attention, ATTENTION_PTRS, ("scale",),
        dict(H=8, D=64, HISTORY=True, PARTS=1, PREFIX_PARTS=-1, CASCADE=False, BLOCK_M=16, BLOCK_N=16,
             PRECISION="tf32", PDL=True, LAZY=True)), 1),
    "codec: static-chunk attention after a stream's history, its keys in 4 parts": (chunk_attention._chunk_attention,
        *signature(chunk_attention._chunk_attention, ATTENTION_PTRS, ("scale",),
                   dict(H=8, D=64, HISTORY=True, PARTS=4, PREFIX_PARTS=2, CASCADE=False, BLOCK_M=64, BLOCK_N=32,
                        PRECISION="tf32", PDL=True, LAZY=False)), 4),
    "codec: static-chunk attention after a stream's history, the prefix's part merged": (
        chunk_attention._chunk_attention, *signature(chunk_attention._chunk_attention, ATTENTION_PTRS, ("scale",),
            dict(H=8, D=64, HISTORY=True, PARTS=1, PREFIX_PARTS=-1, CASCADE=True, BLOCK_M=16, BLOCK_N=16,
                 PRECISION="tf32", PDL=True, LAZY=False)), 1),
    "codec: the voice prefix's part, once per voice": (chunk_attention._prefix_part, *signature(
        chunk_attention._prefix_part, {"Q": BF16, "KP": BF16, "VP": BF16, "ROWS": "*i64", "ML": "*fp32",
                                       "ACC": "*fp32"}, ("scale",),
        dict(H=8, D=64, BLOCK_M=64, BLOCK_N=64, PRECISION="tf32", PDL=True)), 4),
    MEGAKERNEL: (megakernel._blocks, *signature(
        megakernel._blocks, {**{name: BF16 for name in megakernel._blocks.arg_names if name[0].isupper()
                                and name not in ("M", "T")},
                             "LENGTHS": "*i32", "HCOUNT": "*i32", "KEEP_LEN": "*i32", "COUNT": "*i32", "GEN": "*i32",
                             "PROWS": "*i64", "HROWS": "*i64", "KEEP_AT": "*i64", "x_off": "i64",
                             "normed_off": "i64"}, ("scale", "eps3", "eps1"),
        dict(C=256, H=8, D=64, FF=1024, PREFIX=True, HISTORY=True, SYNC=True, BM=64, BN=64, BK=64, AM=32, AN=32,
             ROWS=16, BLOCK_C=256, IEEE=False, PRECISION="tf32", FLATTEN=False)), 4),
    "codec: static-chunk attention's parts combined": (chunk_attention._combine_parts, *signature(
        chunk_attention._combine_parts, {"ML": "*fp32", "ACC": "*fp32", "O": BF16}, (),
        dict(H=8, D=64, PARTS=4, BLOCK_M=32, PDL=True)), 4),
    "codec: static-chunk attention, float32 (tests)": (chunk_attention._chunk_attention, *signature(
        chunk_attention._chunk_attention, {name: "*fp32" if kind == BF16 else kind for name, kind in ATTENTION_PTRS.items()},
        ("scale",), dict(H=2, D=16, HISTORY=True, PARTS=1, PREFIX_PARTS=-1, CASCADE=False, BLOCK_M=16, BLOCK_N=16,
                         PRECISION="ieee", PDL=False, LAZY=False)), 4),
    "codec: frame norm (norm, Mish, time term, second norm)": (frame_ops._frame_norm, *signature(
        frame_ops._frame_norm, FRAME_NORM_PTRS, ("eps1", "eps2"),
        dict(NORM=True, MISH=True, ROWS=True, RESIDUAL=False, THEN=True, KEEP=False, HEADS=1, HEAD_D=1, BLOCK_M=16,
             BLOCK_C=256, PDL=True)), 4),
    "codec: frame norm (residual, second norm)": (frame_ops._frame_norm, *signature(
        frame_ops._frame_norm, FRAME_NORM_PTRS, ("eps1", "eps2"),
        dict(NORM=False, MISH=False, ROWS=False, RESIDUAL=True, THEN=True, KEEP=False, HEADS=1, HEAD_D=1, BLOCK_M=16,
             BLOCK_C=256, PDL=True)), 4),
    "codec: frame norm keeping an attention's keys and values": (frame_ops._frame_norm, *signature(
        frame_ops._frame_norm, FRAME_NORM_PTRS, ("eps1", "eps2"),
        dict(NORM=False, MISH=False, ROWS=False, RESIDUAL=True, THEN=True, KEEP=True, HEADS=8, HEAD_D=64, BLOCK_M=16,
             BLOCK_C=256, PDL=True)), 4),
    "codec: the feed-forward's first product with its GELU": (fused_linear._linear_gelu, *signature(
        fused_linear._linear_gelu, {"X": BF16, "W": BF16, "BIAS": BF16, "OUT": BF16}, (),
        dict(HAS_BIAS=True, IEEE=False, BLOCK_M=64, BLOCK_N=64, BLOCK_K=fused_linear.BLOCK_K, PDL=True)), 4),
    "codec: a product at few frames, its weights read before the wait (K 256)": prefetch(4, BLOCK_M=32, BLOCK_N=32),
    "codec: a product at few frames, its weights read before the wait (K 1024, GELU)": prefetch(
        4, GELU=True, CHUNKS=4, BLOCK_M=32),
    "codec: a product at few frames, its weights read before the wait (K 256, a norm folded in, a residual, kept keys)": (
        prefetch(2, GELU=True, NORM=True, RESIDUAL=True, KEEP=True, HEADS=8, HEAD_D=64)),
    "codec: a product at few frames, its weights read before the wait (a convolution's 3 taps of 256, a history)": (
        prefetch(2, TAPS=3, LEFT=True, KEEP_LEFT=True, CHUNKS=3)),
    "codec: causal unfold with a prompt prefix": (frame_ops._causal_unfold, *signature(
        frame_ops._causal_unfold, {"X": BF16, "FRAMES": BF16, "ROWS": "*i64", "KEEP_ROWS": "*i64", "LENGTHS": "*i32",
                                   "OUT": BF16}, (),
        dict(K=3, LEFT=True, KEEP=False, BLOCK_T=16, BLOCK_C=512, PDL=True)), 4),
    "codec: causal unfold keeping a stream's last frames": (frame_ops._causal_unfold, *signature(
        frame_ops._causal_unfold, {"X": BF16, "FRAMES": BF16, "ROWS": "*i64", "KEEP_ROWS": "*i64", "LENGTHS": "*i32",
                                   "OUT": BF16}, (),
        dict(K=3, LEFT=True, KEEP=True, BLOCK_T=16, BLOCK_C=512, PDL=True)), 4),
    "codec: HiFT's snake": (snake._snake, *signature(
        snake._snake, {"X": BF16, "ALPHA": BF16, "OUT": BF16}, (), dict(BLOCK_T=snake.BLOCK_T)), 4),
    "codec: guided Euler step": (frame_ops._euler_step, *signature(
        frame_ops._euler_step, {"IN": BF16, "V": BF16, "MASK": BF16, "DT": BF16}, ("dt", "cfg_rate"),
        dict(DT_PER_ROW=False, BLOCK_T=16, BLOCK_C=128, PDL=True)), 4),
    "codec: guided Euler step, a step size per row": (frame_ops._euler_step, *signature(
        frame_ops._euler_step, {"IN": BF16, "V": BF16, "MASK": BF16, "DT": "*fp32"}, ("dt", "cfg_rate"),
        dict(DT_PER_ROW=True, BLOCK_T=16, BLOCK_C=128, PDL=True)), 4),
    "encoder: causal attention over the slot pool": (encoder_attention._causal_pool_attention, *signature(
        encoder_attention._causal_pool_attention, {"Q": BF16, "K": BF16, "V": BF16, "OUT": BF16, "BLOCKS": "*i32",
                                                   "META": "*i32"}, ("scale",),
        dict(D=64, BLOCK_M=encoder_attention.BLOCK_M, BLOCK_N=encoder_attention.BLOCK_N, PRECISION="tf32")), 4),
}


def compiled(name: str, aligned: bool = False):
    """KERNELS[name] compiled for sm_90. aligned: its pointers and integer strides and offsets 16-divisible, as a
    launch specialises them (cp.async and its pipelining: the shared memory a GPU would see;
    tests/test_megakernel.py reads it)."""
    kernel, sig, constexprs, warps = KERNELS[name]
    attrs = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(kernel.arg_names)
             if aligned and arg not in constexprs and (sig[arg].startswith("*") or sig[arg] in ("i32", "i64")
                                                       and (arg.startswith("s") or arg.endswith("_off")))}
    return triton.compile(ASTSource(kernel, sig, constexprs=constexprs, attrs=attrs), target=TARGET,
                          options={"num_warps": warps, **OPTIONS.get(name, {})})


def cubin_listing(name: str, tool: str, *flags: str) -> str:
    """The output of one of the triton wheel's CUDA tools (nvdisasm, cuobjdump) on KERNELS[name]'s sm_90 cubin
    (aligned, as a launch compiles it)."""
    import subprocess
    import tempfile
    from pathlib import Path

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled(name, aligned=True).asm["cubin"])
        f.flush()
        return subprocess.run([str(path), *flags, f.name], capture_output=True, text=True, check=True).stdout


def resources(name: str) -> dict[str, int]:
    """KERNELS[name]'s registers a thread and local memory (spills) a thread, as ptxas allotted them."""
    import re

    usage = cubin_listing(name, "cuobjdump", "--dump-resource-usage")
    return {"registers": int(re.search(r"REG:(\d+)", usage).group(1)),
            "local_bytes": int(re.search(r"LOCAL:(\d+)", usage).group(1))}


def loop_steps(name: str) -> list[int]:
    """The instructions of one trip round each loop of KERNELS[name]'s sm_90 code (aligned, as a launch compiles it),
    on its shortest path: a loop's body from its label to the branch back, less what a branch inside it can skip.
    Read from nvdisasm's listing (the one in the triton wheel); loops in the order they appear."""
    import re

    listing = cubin_listing(name, "nvdisasm", "-c")
    at: dict[str, int] = {}    # label → the index of the instruction after it
    code: list[str] = []       # instructions, in order
    for line in listing.splitlines():
        if m := re.match(r"^(\.L_x_\d+):", line):
            at[m.group(1)] = len(code)
        elif re.match(r"^\s+/\*[0-9a-f]+\*/\s", line):
            code.append(line)
    branches = [(i, m.group(1)) for i, line in enumerate(code) if (m := re.search(r"BRA `\((\.L_x_\d+)\)", line))]
    steps = []
    for i, label in branches:
        start = at[label]
        if start > i:
            continue  # forward: not a loop
        skippable = sum(at[target] - j - 1 for j, target in branches if start <= j < i and j < at[target] <= i)
        if i > start:  # (not the trap that ends the code: a branch to itself)
            steps.append(i - start + 1 - skippable)
    return steps


def main() -> int:
    if sys.argv[1:2] == ["--loop-steps"]:  # (tests/test_kernel_compile.py): each loop's instructions, and resources
        import json

        names = sys.argv[2:] or [ATTENTION_EVERY_BLOCK, ATTENTION_SMALL_TILE]
        print(json.dumps({name: {"steps": loop_steps(name), **resources(name)} for name in names}))
        return 0
    failed = 0
    for name in KERNELS:
        try:
            print(f"ok   {name}: {len(compiled(name).asm['cubin'])} bytes of sm_90 cubin")
        except Exception:  # noqa: BLE001
            failed += 1
            print(f"FAIL {name}:\n{traceback.format_exc(limit=2)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
