"""PNG plots of a bench result (matplotlib, no display): the TTFA distribution per level, and TTFA p50/p95 and
the stall-free share against concurrency.

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


def draw(result: dict, out: Path) -> list[Path]:
    """The TTFA distribution; with concurrency levels (not a Poisson run) the sweep too."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [ttfa_distribution(result, out / "ttfa_distribution.png")]
    if all(str(label).isdigit() for label in result["levels"]):
        paths.append(sweep(result, out / "sweep.png"))
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
