"""llm engine benchmark: our engine's prefill and decode-step times against the floor measured in the same run
and against a Hugging Face transformers peer (the peer docs/benchmarks.md compares against), one GPU, real dimensions, random weights.

GPU run (one H100/H200, ~6-8 minutes; everything prints as it goes, the table comes last):

    PYTHONUNBUFFERED=1 python3 bench/llm_engine.py --preset moss-speech --device cuda --json "$OUT/llm_engine.json"

Smoke run on a CPU (tiny model, seconds):

    python bench/llm_engine.py --preset tiny --device cpu --batches 1,8 --contexts 64,128 --prefills 32,64

Phases, in order (model and peer never share the device):
1. copy bandwidth: a large device-to-device copy; bandwidth = (bytes read + bytes written) / time.
2. GEMM floor: the audio path's weight matrices (32 shared + 4 audio layers' q,k,v,o,gate,up,down + the audio
   head), one F.linear each at the step's row count, replayed from a CUDA graph (`gemm_floor`).
3. paged-vs-dense check: paged prefill + 4 decode steps against one dense forward (`--check-only` stops here).
4. ours, through the public engine API (LLMEngine.step()):
   - prefill P: one request of P positions ((P-1) random ids < 150000, then sosp), alone in its step;
     median over --prefill-reps fresh prompts after one warm-up (fresh prompts: no prefix-cache hits).
   - decode B x C: B requests with C-position prompts, stepped until all B are decoding, then --warmup
     steps, then --steps steps back to back (one synchronize before, one after: a sync per step would undo
     the engine's overlap of host work with the GPU), reported as their mean; every timed step is checked
     to be a pure decode step of all B sequences. min_new_tokens = max_new_tokens, so no
     sequence ends early; the remaining sequences are aborted afterwards.
5. the HF peer (bench/hf_peer.py), after our model and KV pool are freed: prefill forwards, a decode forward at
   each batch at the peer contexts, `generate` at batch 1 and 32.

Floors: decode B x C = GEMM chain at B rows + the time to read the step's K/V once at the measured copy
bandwidth (bytes = sum over the B sequences of the positions attended x 36 audio-path layers x 2 x kv_heads x
head_dim x itemsize; the positions attended are counted during the timed steps, ~C + a few). Prefill P = GEMM
chain at P rows + writing P positions' K/V at the same bandwidth.

Roofline, beside it (what no implementation beats, the products' library aside): the larger of the step's bytes over
the copy bandwidth (the audio path's weights read once, the K/V read, and for a prefill written, once) and its FLOPs
over the measured bf16 matrix rate (an 8192^3 product; 2 per weight per row, and the attention's 4 x heads x head_dim
per layer and (query, key) pair). Decode at batch 1 is bound by its bytes: the cuBLAS floor above is what its GEMV
kernels take, the roofline what reading the weights at the copy bandwidth takes.

Targets (computed from the numbers, printed after the table): decode <= 1.15 x floor at batch 1 and <= 1.3 x
floor at batch 64 (context 512); prefill 512 <= 1.5 x floor; every decode step >= 6 x faster than the peer's
decode forward at the same batch and context.

Flags: --batches, --contexts (decode cells, all pairs), --prefills, --steps, --warmup, --prefill-reps,
--kv-cache-gb (default: what the largest cell needs, capped by free device memory less --headroom-gb; cells
that do not fit are skipped with the reason), --max-batched-tokens (the step budget while filling),
--max-seconds (time guard: no new cell starts after it, a cell in progress stops early), --peer-seconds
(share of --max-seconds kept for the peer), --peer-contexts, --peer-generate-batches, --no-peer,
--skip-check, --check-only, --dtype, --json.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import shlex
import sys
import time
import traceback

import torch

from services.llm.engine.engine import EngineConfig, LLMEngine
from services.llm.engine.runners import bytes_per_position
from services.llm.model.checkpoint import random_model
from services.llm.model.config import preset
from services.llm.model.tokenizer import tiny_tokenizer

try:
    from bench.hf_peer import measure_peer, transformers_version
    from bench.llm_floor import audio_kv_bytes_per_position, audio_path_weights, copy_bandwidth, gemm_floor
    from bench.llm_report import build_rows, fmt, print_report, targets
    from bench.llm_timing import Prompts, abort_all, check_paged_against_dense, time_decode, time_prefill
    from bench.measure import matmul_rate, sync
except ImportError:  # run as a script: bench/ itself is on sys.path
    from hf_peer import measure_peer, transformers_version
    from llm_floor import audio_kv_bytes_per_position, audio_path_weights, copy_bandwidth, gemm_floor
    from llm_report import build_rows, fmt, print_report, targets
    from llm_timing import Prompts, abort_all, check_paged_against_dense, time_decode, time_prefill

    from measure import matmul_rate, sync

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def free_device(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def device_name(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


# ---- main -----------------------------------------------------------------------------------------------------

def ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--batches", default="1,8,32,64,128", help="decode batch sizes")
    p.add_argument("--contexts", default="512,2048", help="decode contexts (prompt positions)")
    p.add_argument("--prefills", default="128,512,2048", help="prefill lengths (positions, sosp included)")
    p.add_argument("--steps", type=int, default=24, help="timed decode steps per cell (median)")
    p.add_argument("--warmup", type=int, default=4, help="untimed decode steps per cell")
    p.add_argument("--prefill-reps", type=int, default=5, help="timed prefills per length (after one warm-up)")
    p.add_argument("--kv-cache-gb", type=float, help="KV pool; default: what the largest cell needs, capped by free memory")
    p.add_argument("--headroom-gb", type=float, default=8.0, help="device memory left free beside the auto-sized pool")
    p.add_argument("--max-batched-tokens", type=int, default=8192, help="the engine's step budget (fills B x C quickly)")
    p.add_argument("--max-seconds", type=float, default=450.0, help="time guard for the whole run")
    p.add_argument("--peer-seconds", type=float, default=100.0, help="part of --max-seconds kept for the peer")
    p.add_argument("--peer-contexts", help="contexts of the peer's decode forward; default 512 (or the first context)")
    p.add_argument("--peer-generate-batches", default="1,32")
    p.add_argument("--peer-reps", type=int, default=8)
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--skip-check", action="store_true", help="skip the paged-vs-dense check")
    p.add_argument("--check-only", action="store_true", help="only compare paged with dense logits")
    p.add_argument("--quantization", choices=["none", "fp8"], default="none",
                   help="the engine's layer GEMMs (and the floor's): fp8 checks against a second, unquantized copy")
    p.add_argument("--json")
    args = p.parse_args()

    device = torch.device(args.device)
    cfg = preset(args.preset)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    batches, contexts, prefills = sorted(set(ints(args.batches))), sorted(set(ints(args.contexts))), sorted(set(ints(args.prefills)))
    peer_contexts = ints(args.peer_contexts) if args.peer_contexts else ([512] if 512 in contexts or not contexts else contexts[:1])
    deadline = T0 + args.max_seconds
    peer_on = not args.no_peer and transformers_version() is not None
    ours_deadline = deadline - (args.peer_seconds if peer_on else 0.0)

    def ours_left() -> float:
        return ours_deadline - time.perf_counter()

    result = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]), "argv": sys.argv,
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "preset": args.preset,
        "device": device_name(device), "dtype": str(dtype), "quantization": args.quantization, "torch": torch.__version__,
        "transformers": transformers_version(), "cuda": torch.version.cuda, "args": vars(args),
        "batches": batches, "contexts": contexts, "prefill_lengths": prefills, "peer_contexts": peer_contexts,
        "ours": {"prefill": {}, "decode": {}}, "gemm_floor_ms": {}, "skipped": {}, "errors": {}, "phases": {},
    }

    def save() -> None:
        result["total_seconds"] = time.perf_counter() - T0
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2, default=str)

    def skip(what: str, why: str) -> None:
        result["skipped"][what] = why
        log(f"{what}: skipped: {why}")

    if device.type == "cuda":
        result["device_memory_gib"] = torch.cuda.get_device_properties(device).total_memory / 2**30
    log(f"{result['device']}, torch {torch.__version__}, transformers {result['transformers']}, {args.preset} {dtype}, "
        f"quantization {args.quantization}")
    log(f"command: {result['command']}")

    # ---- model
    t = time.perf_counter()
    model = random_model(cfg, device=device, dtype=dtype)
    sync(device)
    result["phases"]["build_model_s"] = time.perf_counter() - t
    result["parameters"] = sum(x.numel() for x in model.parameters())
    path = audio_path_weights(model)  # the layers' then the head: FP8 holds the layers in a byte an element
    layer_bytes = 1 if args.quantization == "fp8" else path[0].element_size()
    result["audio_path_weight_bytes"] = sum(w.numel() * layer_bytes for w in path[:-1]) + path[-1].numel() * path[-1].element_size()
    result["audio_path_params"] = sum(w.numel() for w in path)
    result["attention_flops_per_pair"] = 4 * cfg.num_attention_heads * cfg.head_dim * (
        cfg.num_shared_layers + cfg.num_modality_layers)  # QK and PV, a (query, key) pair, over the audio path
    log(f"model built: {result['parameters'] / 1e9:.2f}B parameters in {result['phases']['build_model_s']:.1f}s")

    kvpp = audio_kv_bytes_per_position(cfg, dtype)
    result["audio_kv_bytes_per_position"] = kvpp
    if not args.check_only:
        # ---- floors
        t = time.perf_counter()
        bw = copy_bandwidth(device)
        result["copy_bandwidth_bytes_per_s"] = bw
        log(f"copy bandwidth: {bw / 1e12:.3f} TB/s (read + write)")
        if device.type == "cuda":
            result["bf16_matmul_flops_per_s"] = matmul_rate()
            log(f"bf16 matrix rate: {result['bf16_matmul_flops_per_s'] / 1e12:.0f} TFLOP/s (an 8192^3 product)")
        for rows_ in sorted(set(batches) | set(prefills)):
            result["gemm_floor_ms"][str(rows_)] = gemm_floor(model, rows_, device, reps=20 if rows_ <= 256 else 10,
                                                             quantization=args.quantization) * 1e3
            log(f"GEMM floor at {rows_} rows: {result['gemm_floor_ms'][str(rows_)]:.3f} ms")
        free_device(device)
        result["phases"]["floors_s"] = time.perf_counter() - t
        save()

    # ---- engine: a pool for the largest cell (or --kv-cache-gb)
    block = EngineConfig().block_size
    budget = max(args.max_batched_tokens, max(prefills, default=0) + 1, max(batches, default=1))

    def new_tokens_for(b: int, c: int) -> int:  # fill steps (the first ones decode meanwhile) + warm-up + timed + margin
        return math.ceil(b * (c + 1) / budget) + 2 + args.warmup + args.steps + 4

    def positions_for(b: int, c: int) -> int:  # blocks' worth of positions for b sequences
        return b * (math.ceil((c + new_tokens_for(b, c)) / block) + 1) * block

    need = max([positions_for(b, c) for b in batches for c in contexts] + [max(prefills, default=0) + 2 * block, 512])
    if args.check_only:
        need = 4096
    # K/V (+ the kept trunk output), in cfg's dtype
    per_position = bytes_per_position(cfg, EngineConfig(quantization=args.quantization), device)
    if args.kv_cache_gb:
        pool_bytes = int(args.kv_cache_gb * (1 << 30))
    else:
        pool_bytes = need * per_position
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            cfg_itemsize = cfg.kv_bytes_per_token // (cfg.num_layers * 2 * cfg.num_key_value_heads * cfg.head_dim)
            real_per_token = per_position * torch.empty((), dtype=dtype).element_size() // cfg_itemsize
            cap_tokens = max(0, free - int(args.headroom_gb * (1 << 30))) // real_per_token
            if need > cap_tokens:
                log(f"KV pool: the largest cell needs {need * real_per_token / 2**30:.1f} GiB, "
                    f"{free / 2**30:.1f} GiB free: capped at {cap_tokens * real_per_token / 2**30:.1f} GiB")
                pool_bytes = cap_tokens * per_position
    max_len = max([c + new_tokens_for(b, c) + block for b in batches for c in contexts] + [4096])
    config = EngineConfig(kv_cache_bytes=pool_bytes, max_num_seqs=max(batches + [16]),
                          max_num_batched_tokens=budget, max_model_len=max_len, quantization=args.quantization)
    tokenizer = tiny_tokenizer(preset("tiny")) if args.preset != "tiny" else tiny_tokenizer(cfg)  # prompts are token ids
    t = time.perf_counter()
    engine = LLMEngine(model, tokenizer, config)
    sync(device)
    gc.collect()
    gc.freeze()  # as the llm server does after startup: collections skip the model's objects
    result["phases"]["build_engine_s"] = time.perf_counter() - t
    num_blocks = engine.block_manager.num_blocks
    result["kv_pool_gb"] = pool_bytes / 2**30
    result["kv_pool_blocks"] = num_blocks
    result["engine_config"] = {k: getattr(config, k) for k in config.__dataclass_fields__}
    log(f"engine: {num_blocks} blocks of {block} ({num_blocks * block} positions, {pool_bytes / 2**30:.1f} GiB budget), "
        f"max_num_seqs {config.max_num_seqs}, step budget {budget}")

    # ---- correctness
    if not args.skip_check or args.check_only:
        t = time.perf_counter()
        try:
            # FP8 layers empty the model's own (forward.py): the dense forward runs on a second copy, unquantized
            dense = model if args.quantization == "none" else random_model(cfg, device=device, dtype=dtype)
            rel_err = check_paged_against_dense(dense, engine, min(200, max(contexts + prefills + [16])), 4, device)
            dense = None
            result["paged_vs_dense_max_rel_err"] = rel_err
            log(f"paged vs dense logits: max rel err {rel_err:.2e} ({time.perf_counter() - t:.1f}s)")
        except Exception as e:  # noqa: BLE001 — report and go on to the timings
            result["errors"]["check"] = f"{type(e).__name__}: {e}"
            log(f"paged vs dense check FAILED: {type(e).__name__}: {e}")
            traceback.print_exc()
            abort_all(engine)
        if args.check_only:
            print(f"{result['device']}, {args.preset}, {dtype}: paged vs dense logits, max rel err "
                  f"{fmt(result.get('paged_vs_dense_max_rel_err'), '.2e')}", flush=True)
            save()
            return

    # ---- ours: prefill
    prompts = Prompts(cfg)
    t = time.perf_counter()
    for length in prefills:
        what = f"prefill {length}"
        if ours_left() <= 0:
            skip(what, "time guard")
            continue
        if length > num_blocks * block:
            skip(what, f"{length} positions do not fit the pool of {num_blocks * block}")
            continue
        try:
            r = time_prefill(engine, prompts, length, args.prefill_reps, device, ours_left)
            result["ours"]["prefill"][str(length)] = r
            log(f"ours: {what}: {r['ms']:.2f} ms (median of {r['reps']}, min {r['min_ms']:.2f})")
        except Exception as e:  # noqa: BLE001
            result["errors"][what] = f"{type(e).__name__}: {e}"
            log(f"ours: {what} FAILED: {type(e).__name__}: {e}")
            traceback.print_exc()
            abort_all(engine)
        save()
    result["phases"]["ours_prefill_s"] = time.perf_counter() - t

    # ---- ours: decode
    t = time.perf_counter()
    for c in contexts:
        for b in batches:
            what = f"decode {b}x{c}"
            blocks_needed = positions_for(b, c) // block
            if ours_left() <= 0:
                skip(what, "time guard")
                continue
            if blocks_needed > num_blocks:
                skip(what, f"needs {blocks_needed} KV blocks ({blocks_needed * block * per_position / 2**30:.1f} GiB), "
                           f"the pool has {num_blocks}")
                continue
            if c + new_tokens_for(b, c) > engine.context_limit:
                skip(what, f"context {c} + {new_tokens_for(b, c)} new tokens exceeds the engine's limit {engine.context_limit}")
                continue
            try:
                r = time_decode(engine, prompts, b, c, args.steps, args.warmup, new_tokens_for(b, c), device, ours_left)
                result["ours"]["decode"][f"{b}x{c}"] = r
                log(f"ours: {what}: {r['ms']:.2f} ms per step ({r['steps']} back to back; per call median "
                    f"{r['median_call_ms']:.2f}, min {r['min_ms']:.2f}, max {r['max_ms']:.2f}; "
                    f"mean context {r['mean_attended_positions']:.0f}; filled in "
                    f"{r['fill_steps']} steps, {r['fill_seconds']:.1f}s){'; ' + r['note'] if r['note'] else ''}")
            except Exception as e:  # noqa: BLE001
                result["errors"][what] = f"{type(e).__name__}: {e}"
                log(f"ours: {what} FAILED: {type(e).__name__}: {e}")
                if not isinstance(e, TimeoutError):
                    traceback.print_exc()
                abort_all(engine)
                free_device(device)
            save()
    result["phases"]["ours_decode_s"] = time.perf_counter() - t

    # ---- the peer, alone on the device
    del engine, model
    free_device(device)
    if device.type == "cuda":
        log(f"ours freed: {torch.cuda.memory_allocated(device) / 2**30:.2f} GiB still allocated, "
            f"{torch.cuda.mem_get_info(device)[0] / 2**30:.1f} GiB free")
    if args.no_peer:
        result["peer"] = {"skipped": ["--no-peer"]}
    else:
        t = time.perf_counter()
        result["peer"] = measure_peer(
            cfg, device, dtype, prefills=prefills, batches=batches, contexts=peer_contexts,
            generate_batches=ints(args.peer_generate_batches), reps=args.peer_reps,
            time_left=lambda: deadline - time.perf_counter(), log=log,
            vocab_limit=min(cfg.vocab_size, 150000, cfg.endoftext_token_id))
        # JSON keys as strings, like ours
        for k in ("prefill", "decode", "generate"):
            result["peer"][k] = {str(key): v for key, v in result["peer"].get(k, {}).items()}
        result["phases"]["peer_s"] = time.perf_counter() - t

    result["rows"] = build_rows(result)
    result["targets"] = targets(result["rows"])
    save()
    if args.json:
        log(f"JSON: {args.json}")
    print_report(result)


if __name__ == "__main__":
    main()
