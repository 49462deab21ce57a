"""bench/restart.sh's table: each start's and each kill's times, from its events, the stack's log and the loads.

    python3 bench/restart_report.py DIR [--json restart.json]

DIR holds events.tsv (restart.sh's lines: start LABEL T0 TURN_S GRAPHS_S, kill STAGE T0 SAY_S K [SESSION]), up_LABEL.log,
log_kill_K.txt and load_K/bench.json. A start: its first answered turn, the vocoder's and the llm's "serving" lines
and the vocoder's last graph, in seconds after `up` (T0). A kill: when the gateway found the stage ready again (the
later of llm and vocoder where all were restarted: a fault, or a kill that faulted the other), the first reply audio
at the load's client of a turn sent after the kill, when the stack found it (a stage's "its GPU failed", or up's word
that the killed stage exited), the probe's answer (bench/answer_probe.py; a `moss-serve say` a try before
2026-11-30's calls 10 on), the session opened before the kill (answer_probe.py --session: the seconds to its next
answered turn, and whether that turn's prompt held the first turn: its history went on), whether another stage
faulted (exited with code 3), and the seconds of each step of the GPU stages' starts after it (STEPS, from their logs).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
from pathlib import Path

STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)"


def unix(stamp: str) -> float:
    """A log line's time (UTC, as the services log it) → seconds since the epoch."""
    when = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
    return when.replace(tzinfo=datetime.timezone.utc).timestamp()


def first_line(log: Path, pattern: str) -> float | None:
    for line in log.read_text(errors="replace").splitlines():
        if m := re.match(STAMP + " " + pattern, line):
            return unix(m.group(1))
    return None


def start_row(dir_: Path, label: str, t0: float, turn: str, graphs: str) -> dict:
    log = dir_ / f"up_{label}.log"
    at = lambda t: None if t is None else round(t - t0, 1)  # noqa: E731
    return dict(start=label, first_turn_s=num(turn), every_graph_s=num(graphs),
                vocoder_serving_s=at(first_line(log, r"INFO services.common.server: vocoder serving")),
                llm_serving_s=at(first_line(log, r"INFO services.common.server: llm serving")))


def kill_row(dir_: Path, stage: str, t0: float, say: str, k: str, session: str = "") -> dict:
    log = dir_ / f"log_kill_{k}.txt"
    text = log.read_text(errors="replace") if log.exists() else ""
    back = None
    # A fault restarts both, and so does a kill that faulted the other (up: "... too: they share its GPU's MPS server"):
    # the later one is back
    both = stage == "fault" or "too: they share its GPU's MPS server" in text
    for name in ("llm", "vocoder") if both else (stage,):
        m = re.search(STAMP + rf" INFO services.gateway.backends: gateway: {name} at \S+ is ready", text)
        back = None if m is None else max(back or 0.0, unix(m.group(1)) - t0)
        if back is None:
            break
    first_audio = None
    bench = dir_ / f"load_{k}" / "bench.json"
    if bench.exists():
        level = next(iter(json.loads(bench.read_text())["levels"].values()))
        began = level["started_unix"]
        after = [began + s["sent_s"] + s["chunk_arrivals_s"][0] - t0 for s in level["streams"]
                 if s["code"] == "OK" and s["chunk_arrivals_s"] and began + s["sent_s"] > t0]
        first_audio = min(after, default=None)
    faulted = sorted(set(re.findall(r"moss-serve up: (\w+) exited with code 3", text)))
    # When the stack found it: a stage's word that its GPU failed (a fault), or up's that the killed stage exited. On an
    # H200 a fault was once found 11.2 s after its store (docs/benchmarks.md, starts-2026-11-30).
    found = (re.search(STAMP + r" CRITICAL \S+: \w+: its GPU failed", text) if stage == "fault" else
             re.search(STAMP + rf" moss-serve up: {stage}\S* exited with code", text))
    # the session probe's line: "SECONDS FIRST_PROMPT ANSWERED_PROMPT yes|no", or "null REASON"
    fields = session.split()
    session_s = num(fields[0]) if fields and re.fullmatch(r"[\d.]+", fields[0]) else None
    history = fields[3] if session_s is not None and len(fields) == 4 else None
    return dict(killed=stage, found_s=None if found is None else rnd(unix(found.group(1)) - t0), back_s=rnd(back),
                load_first_audio_s=rnd(first_audio), say_s=num(say), session_s=session_s, session_history=history,
                session_note=None if session_s is not None or not fields else session, faulted=faulted,
                steps=start_steps(text))


# The steps of a GPU stage's start, as its log says them (services/*/server.py, services/vocoder/loader.py): the first
# of each after the kill, in seconds. A restart of every GPU stage is as slow as its slowest stage's sum of these.
STEPS = (
    ("llm context", r"llm: its CUDA context made in ([\d.]+) s"),
    ("llm weights", r"the weights took ([\d.]+) s"),
    ("llm KV and runner", r"llm: the KV cache and the runner \(its CUDA graphs on a GPU\) ready in ([\d.]+) s"),
    ("llm warm-up", r"llm: warm-up of \d+ synthetic turns in ([\d.]+) s"),
    ("vocoder context", r"vocoder: its CUDA context made in ([\d.]+) s"),
    ("vocoder flow move", r"vocoder: the flow moved to \S+ in ([\d.]+) s"),
    ("vocoder voices, history, generator", r"the stream history and the generator set up in ([\d.]+) s"),
    ("vocoder covers", r"vocoder: \d+ CUDA graphs captured before serving in ([\d.]+) s"),
)


def start_steps(text: str) -> dict[str, float]:
    """The seconds of each start step (STEPS) that the log of a kill shows, by name."""
    found = {}
    for name, pattern in STEPS:
        if m := re.search(pattern, text):
            found[name] = float(m.group(1))
    return found


def num(s: str) -> float | None:
    return None if s in ("", "null") else float(s)


def rnd(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    dir_ = Path(a.dir)
    starts, kills = [], []
    for line in (dir_ / "events.tsv").read_text().splitlines():
        kind, *f = line.split("\t")
        if kind == "start":
            starts.append(start_row(dir_, f[0], float(f[1]), f[2], f[3]))
        elif kind == "kill":
            kills.append(kill_row(dir_, f[0], float(f[1]), f[2], f[3], f[4] if len(f) > 4 else ""))
    show = lambda x: "–" if x is None else f"{x} s"  # noqa: E731
    print("| start | first turn answered | vocoder serving | llm serving | every vocoder graph |")
    print("| --- | --- | --- | --- | --- |")
    for r in starts:
        print(f"| {r['start']} | {show(r['first_turn_s'])} | {show(r['vocoder_serving_s'])} | "
              f"{show(r['llm_serving_s'])} | {show(r['every_graph_s'])} |")
    print("\n| killed | found | stage back | load's next first audio | probe answered | session's next turn | "
          "its history | faulted (exit 3) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in kills:
        print(f"| {r['killed']} | {show(r['found_s'])} | {show(r['back_s'])} | {show(r['load_first_audio_s'])} | {show(r['say_s'])} | "
              f"{show(r['session_s'])} | {r['session_history'] or r['session_note'] or '–'} | {', '.join(r['faulted']) or 'none'} |")
    if any(r["steps"] for r in kills):
        print("\n| killed | " + " | ".join(name for name, _ in STEPS) + " |")
        print("| --- |" + " --- |" * len(STEPS))
        for r in kills:
            print(f"| {r['killed']} | " + " | ".join(show(r["steps"].get(name)) for name, _ in STEPS) + " |")
    if a.json:
        Path(a.json).write_text(json.dumps(dict(starts=starts, kills=kills), indent=1))


if __name__ == "__main__":
    main()
