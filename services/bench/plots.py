"""PNG plots of a bench result (matplotlib, no display): the TTFA distribution per level; TTFA p50/p95 and the
stall-free share against concurrency; and the knee: goodput (stall-free streams a second) and refusals against the
offered load, with TTFA p95.

    python -m services.bench.plots bench.json [--out DIR]     # redraw from a saved result
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    return plt


def ttfa_distribution(result: dict, path: Path) -> Path:
    """Empirical CDF of the client's TTFA at each level."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for level, data in result["levels"].items():
        ttfa = sorted(s["chunk_arrivals_s"][0] * 1e3 for s in data["streams"] if s["code"] == "OK" and s["chunk_arrivals_s"])
        if ttfa:
            ax.step(ttfa, [(i + 1) / len(ttfa) for i in range(len(ttfa))], where="post", label=f"{level} streams")
    ax.set_xlabel("time to first audio at the client (ms)")
    ax.set_ylabel("share of streams")
    ax.set_title("TTFA distribution")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def sweep(result: dict, path: Path) -> Path:
    """TTFA p50 / p95 (left axis, log) and the stall-free share (right axis) against concurrency."""
    plt = _pyplot()
    levels = sorted(result["levels"].items(), key=lambda kv: int(kv[0]))
    xs = [int(k) for k, _ in levels]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for q, style in (("p50", "o-"), ("p95", "s--")):
        ax.plot(xs, [lv["summary"]["ttfa_seconds"][q] * 1e3 for _, lv in levels], style, label=f"TTFA {q}")
    ax.axhline(300, color="grey", lw=0.8, ls=":", label="TTFA p95 bound (300 ms)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("TTFA at the client (ms)")
    share = ax.twinx()
    share.plot(xs, [lv["summary"]["stall_free_share"] * 100 for _, lv in levels], "^-", color="tab:green",
               label="stall-free streams")
    share.set_ylabel("stall-free streams (%)")
    share.set_ylim(0, 105)
    lines = ax.get_legend_handles_labels()
    more = share.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="center left")
    ax.set_title(f"capacity: {result['capacity']} streams")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def knee(result: dict, path: Path) -> Path:
    """Goodput and refusals a second (left axis) and TTFA p95 (right axis) against the offered load: where goodput
    stops following the offered load is the knee; past it a service that refuses the excess keeps its goodput."""
    plt = _pyplot()
    levels = sorted((lv["summary"] for lv in result["levels"].values()), key=lambda lv: lv["offered_per_second"])
    xs = [lv["offered_per_second"] for lv in levels]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(xs, xs, ":", color="grey", lw=0.8, label="offered")
    ax.plot(xs, [lv["goodput_per_second"] for lv in levels], "o-", label="goodput (stall-free streams/s)")
    ax.plot(xs, [lv["refused"] / lv["wall_seconds"] for lv in levels], "x--", label="refused/s")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("streams a second")
    ttfa = ax.twinx()
    ttfa.plot(xs, [lv["ttfa_seconds"]["p95"] * 1e3 for lv in levels], "s-", color="tab:red", label="TTFA p95 (admitted)")
    ttfa.axhline(300, color="tab:red", lw=0.8, ls=":")
    ttfa.set_ylim(0, max([350.0] + [lv["ttfa_seconds"]["p95"] * 1.1e3 for lv in levels if lv["ttfa_seconds"]["p95"] > 0]))
    ttfa.set_ylabel("TTFA p95 at the client (ms)")
    lines, more = ax.get_legend_handles_labels(), ttfa.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    ax.set_title("offered load against goodput")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def draw(result: dict, out: Path) -> list[Path]:
    """The TTFA distribution and the knee; with concurrency levels (not a Poisson run) the sweep too."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [ttfa_distribution(result, out / "ttfa_distribution.png")]
    if all(str(label).isdigit() for label in result["levels"]):
        paths.append(sweep(result, out / "sweep.png"))
    if all("offered_per_second" in lv["summary"] for lv in result["levels"].values()):  # (results before goodput: none)
        paths.append(knee(result, out / "goodput.png"))
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("result")
    p.add_argument("--out")
    args = p.parse_args()
    result = json.loads(Path(args.result).read_text())
    for path in draw(result, Path(args.out) if args.out else Path(args.result).parent):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
