"""The llm benchmark's report (bench/llm_engine.py): its result dict → table rows with ratios to the floor
and the peer, the issue's targets as PASS/MISS lines, and the printed table."""

from __future__ import annotations

import re

# ---- report ---------------------------------------------------------------------------------------------------

def fmt(x, spec="8.2f", unit="") -> str:
    if x is None:
        width = int(re.match(r"\d*", spec).group() or 0) + len(unit)
        return f"{'—':>{width}}"
    return f"{x:{spec}}{unit}"


def why_missing(result, what: str) -> str | None:
    return result["skipped"].get(what) or result["errors"].get(what)


def build_rows(result) -> list[dict]:
    rows = []
    bw = result["copy_bandwidth_bytes_per_s"]
    kvpp = result["audio_kv_bytes_per_position"]
    peer = result.get("peer") or {}
    for p in result["prefill_lengths"]:
        ours = result["ours"]["prefill"].get(str(p))
        gemm = result["gemm_floor_ms"].get(str(p))
        kv = p * kvpp / bw * 1e3  # writing its K/V once
        rows.append({"what": f"prefill {p}", "kind": "prefill", "tokens": p,
                     "ours_ms": ours and ours["ms"], "gemm_floor_ms": gemm, "kv_floor_ms": kv,
                     "peer_ms": (peer.get("prefill") or {}).get(str(p)), "skipped": why_missing(result, f"prefill {p}")})
    for c in result["contexts"]:
        for b in result["batches"]:
            key = f"{b}x{c}"
            ours = result["ours"]["decode"].get(key)
            gemm = result["gemm_floor_ms"].get(str(b))
            attended = ours["attended_positions_per_step"] if ours else b * (c + 1)
            rows.append({"what": f"decode b{b} ctx{c}", "kind": "decode", "batch": b, "context": c,
                         "ours_ms": ours and ours["ms"], "gemm_floor_ms": gemm, "kv_floor_ms": attended * kvpp / bw * 1e3,
                         "peer_ms": (peer.get("decode") or {}).get(key), "skipped": why_missing(result, f"decode {key}")})
    for r in rows:
        r["floor_ms"] = None if r["gemm_floor_ms"] is None else r["gemm_floor_ms"] + r["kv_floor_ms"]
        r["ours_over_floor"] = r["ours_ms"] / r["floor_ms"] if r["ours_ms"] and r["floor_ms"] else None
        r["peer_over_ours"] = r["peer_ms"] / r["ours_ms"] if r["ours_ms"] and r["peer_ms"] else None
        r["roofline_ms"] = roofline_ms(result, r)
        r["ours_over_roofline"] = r["ours_ms"] / r["roofline_ms"] if r["ours_ms"] and r["roofline_ms"] else None
    return rows


def roofline_ms(result, r) -> float | None:
    """The larger of a step's bytes over the copy bandwidth (weights once, K/V read or written once) and its FLOPs
    over the bf16 matrix rate (None without that rate: a CPU run)."""
    peak = result.get("bf16_matmul_flops_per_s")
    if not peak or "audio_path_params" not in result:
        return None
    kv_bytes = r["kv_floor_ms"] / 1e3 * result["copy_bandwidth_bytes_per_s"]      # the K/V term's own bytes
    seconds_bytes = (result["audio_path_weight_bytes"] + kv_bytes) / result["copy_bandwidth_bytes_per_s"]
    if r["kind"] == "prefill":
        rows_, pairs = r["tokens"], r["tokens"] * (r["tokens"] + 1) / 2               # causal
    else:
        rows_, pairs = r["batch"], kv_bytes / result["audio_kv_bytes_per_position"]  # each sequence's attended keys
    flops = 2 * result["audio_path_params"] * rows_ + result["attention_flops_per_pair"] * pairs
    return max(seconds_bytes, flops / peak) * 1e3


def targets(rows) -> list[dict]:
    def row(kind, **kw):
        return next((r for r in rows if r["kind"] == kind and all(r.get(k) == v for k, v in kw.items())), None)

    out = []

    def ratio_target(name, r, limit):
        if r is None or r["ours_over_floor"] is None:
            out.append({"target": name, "status": "n/a", "detail": "not measured"})
        else:
            ok = r["ours_over_floor"] <= limit
            out.append({"target": name, "status": "PASS" if ok else "MISS", "value": r["ours_over_floor"],
                        "detail": f"{r['ours_ms']:.2f} ms = {r['ours_over_floor']:.2f} x floor {r['floor_ms']:.2f} ms"})

    ratio_target("decode batch 1, ctx 512: <= 1.15 x floor", row("decode", batch=1, context=512), 1.15)
    ratio_target("decode batch 64, ctx 512: <= 1.3 x floor", row("decode", batch=64, context=512), 1.3)
    ratio_target("prefill 512: <= 1.5 x floor", row("prefill", tokens=512), 1.5)
    with_peer = [r for r in rows if r["kind"] == "decode" and r["peer_over_ours"] is not None]
    name = "every decode step >= 6 x faster than the peer's decode forward (same batch and context)"
    if not with_peer:
        out.append({"target": name, "status": "n/a", "detail": "no decode cell with a peer number"})
    else:
        worst = min(with_peer, key=lambda r: r["peer_over_ours"])
        misses = [r["what"] for r in with_peer if r["peer_over_ours"] < 6]
        out.append({"target": name, "status": "MISS" if misses else "PASS", "value": worst["peer_over_ours"],
                    "detail": f"{len(with_peer)} cells; worst {worst['what']}: {worst['peer_over_ours']:.1f}x"
                              + (f"; misses: {', '.join(misses)}" if misses else "")})
    return out


def print_report(result) -> None:
    rows, tg = result["rows"], result["targets"]
    peer = result.get("peer") or {}
    print(f"\n{result['device']}, torch {result['torch']}, transformers {result.get('transformers')}, "
          f"{result['preset']} {result['dtype']}, {result['date']}", flush=True)
    print(f"copy bandwidth {result['copy_bandwidth_bytes_per_s'] / 1e12:.3f} TB/s (read + write); "
          f"paged vs dense max rel err {fmt(result.get('paged_vs_dense_max_rel_err'), '.2e')}; "
          f"audio-path weights {result['audio_path_weight_bytes'] / 1e9:.2f} GB; KV pool {result['kv_pool_gb']:.2f} GiB")
    if result.get("bf16_matmul_flops_per_s"):
        print(f"bf16 matrix rate {result['bf16_matmul_flops_per_s'] / 1e12:.0f} TFLOP/s (roofline: the larger of bytes "
              f"over the copy bandwidth and FLOPs over this rate)")
    hdr = (f"{'':20} {'ours':>10} {'floor':>10} {'GEMM':>9} {'K/V':>8} {'ours/floor':>10} {'roofline':>10} "
           f"{'ours/roof':>9} {'peer':>10} {'peer/ours':>9}")
    print(hdr)
    for r in rows:
        line = (f"{r['what']:20} {fmt(r['ours_ms'], '8.2f', 'ms')} {fmt(r['floor_ms'], '8.2f', 'ms')} "
                f"{fmt(r['gemm_floor_ms'], '7.2f', 'ms')} {fmt(r['kv_floor_ms'], '6.2f', 'ms')} "
                f"{fmt(r['ours_over_floor'], '9.2f', 'x')} {fmt(r.get('roofline_ms'), '8.2f', 'ms')} "
                f"{fmt(r.get('ours_over_roofline'), '8.2f', 'x')} "
                f"{fmt(r['peer_ms'], '8.2f', 'ms')} {fmt(r['peer_over_ours'], '8.1f', 'x')}")
        if r["ours_ms"] is None and r["skipped"]:
            line += f"  (skipped: {r['skipped']})"
        print(line)
    for b, gen in sorted((peer.get("generate") or {}).items(), key=lambda kv: int(kv[0])):
        print(f"peer generate batch {b}: {gen['ms_per_token']:.1f} ms per token, {gen['tokens_per_s']:.0f} tokens/s "
              f"({gen['new_tokens']} new from {gen['prompt']}-token prompts)")
    for s in (peer.get("skipped") or []):
        print(f"peer skipped: {s}")
    print("targets:")
    for t in tg:
        print(f"  {t['status']:4} {t['target']}: {t['detail']}")
    print(f"total {result['total_seconds']:.0f}s", flush=True)
