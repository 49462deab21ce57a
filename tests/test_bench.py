"""`moss-serve bench`: the listener's clock (stalls), the figures of a level, and the whole client against the
tiny CPU stack, its numbers checked for consistency with the chunk arrival times it recorded."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time

import pytest
from conftest import metric_value, scrape

from services.bench import report
from services.bench.stream import StreamRecord
from services.bench.workload import load_prompts, poisson_arrivals
from services.settings import span

RATE = 24000
SAMPLES_PER_TOKEN = 1920


def record(arrivals: list[float], samples: int = 4800, sent: float = 0.0) -> StreamRecord:
    """A stream whose chunks of `samples` samples (0.2 s each) arrived at these times."""
    return StreamRecord(sent=sent, sample_rate=RATE, chunks=[(t, samples) for t in arrivals])


def test_a_listener_hears_a_stall_when_a_chunk_comes_after_the_audio_before_it_has_played():
    # First audio at 1.0 s; 0.2 s chunks are due at 1.0, 1.2, 1.4, 1.6.
    on_time = record([1.0, 1.05, 1.2, 1.61])          # early, early, 10 ms late: within the 20 ms jitter
    assert on_time.lateness() == pytest.approx([0.0, -0.15, -0.2, 0.01])
    assert on_time.stalls() == [] and on_time.stall_free()
    late = record([1.0, 1.3, 1.35, 1.9])               # 100 ms late, then on time, then 300 ms late
    assert late.stalls() == pytest.approx([0.1, 0.3])
    assert not late.stall_free()
    assert late.ttfa == 1.0 and late.audio_seconds == pytest.approx(0.8)
    assert late.rtf == pytest.approx(1.9 / 0.8)


def test_a_level_counts_errors_apart_and_orders_its_quantiles():
    streams = [record([0.05 * (i + 1), 0.05 * (i + 1) + 0.1]) for i in range(10)]
    streams[3] = record([0.2, 0.9])                    # one stall of 0.5 s
    failed = StreamRecord(sent=0.0, code="UNAVAILABLE", error="llm unavailable")
    lv = report.summarize(streams + [failed], wall=2.0)
    assert (lv["requests"], lv["ok"], lv["errors"]) == (11, 10, {"UNAVAILABLE": 1})
    t = lv["ttfa_seconds"]
    assert t["p50"] <= t["p90"] <= t["p95"] <= t["p99"] <= 0.5
    assert t["p50"] == pytest.approx(0.275)            # median of 0.05 … 0.5 in 0.05 steps (0.2 twice)
    assert (lv["stalls"], lv["stall_free_streams"]) == (1, 9)
    assert lv["stall_seconds"]["max"] == pytest.approx(0.5)
    assert not report.meets_capacity(lv)              # an error, and only 90% stall-free


def test_each_chunks_slack_is_placed_by_its_place_in_its_stream():
    """The second chunk (its listener has the first's 0.2 s only), the third, and every later one apart: p2 / p10 / p50
    of their slack, and how many came with under 50 ms to spare."""
    a = record([1.0, 1.17, 1.2, 1.3, 1.5])     # slack 0.03, 0.2, 0.3, 0.3 (due at 1.2, 1.4, 1.6, 1.8)
    b = record([2.0, 2.05, 2.5, 2.9])           # slack 0.15, -0.1 (late), -0.3 (late)
    places = report.slack_by_place([a, b])
    assert list(places) == list(report.SLACK_PLACES)
    second, third, later = places.values()
    assert second["chunks"] == 2 and second["p50"] == pytest.approx(0.09) and second["under_low_slack"] == 1
    assert third["chunks"] == 2 and third["p2"] == pytest.approx(-0.1 + 0.02 * 0.3) and third["under_low_slack"] == 1
    assert later["chunks"] == 3 and later["p50"] == pytest.approx(0.3) and later["under_low_slack"] == 1
    b.stages = {"llm_second_chunk_seconds": 0.04, "vocoder_second_chunk_in_vocoder_seconds": 0.03,
                "vocoder_second_chunk_queue_seconds": 0.01}
    lv = report.summarize([a, b], wall=3.0)
    assert lv["second_chunk_mean_seconds"]["llm_second_chunk_seconds"] == pytest.approx(0.04)  # (a carries none)
    table = report.slack_table({"2": lv}, markdown=True).splitlines()
    assert table[2] == "| 2 | 2nd | 2 | 32 | 42 | 90 | 1 | 40.0 | 30.0 | 10.0 |"
    assert table[3].startswith("| 2 | 3rd | 2 | -94 |") and table[3].endswith("| - | - | - |")


def test_goodput_counts_stall_free_streams_a_second_and_times_the_refusals():
    """Offered load over the time the requests went out, goodput over the level's wall time; refusals apart."""
    streams = [record([0.1, 0.3], sent=0.0), record([0.6, 0.8], sent=0.5), record([1.1, 1.9], sent=1.0),  # a stall
               record([1.6, 1.8], sent=1.5)]
    refused = [StreamRecord(sent=0.2, code="RESOURCE_EXHAUSTED", done=0.21, retry_after=0.5),
               StreamRecord(sent=0.7, code="RESOURCE_EXHAUSTED", done=0.73)]  # (no hint came with this one)
    lv = report.summarize(streams + refused, wall=3.0)
    assert lv["offered_per_second"] == pytest.approx(5 / 1.5)  # six sends, 1.5 s from the first to the last
    assert lv["goodput_per_second"] == pytest.approx(3 / 3.0)  # three stall-free streams in 3 s
    assert (lv["refused"], lv["refusals_with_hint"]) == (2, 1)
    assert lv["refusal_seconds"]["max"] == pytest.approx(0.03)
    assert lv["refusal_seconds"]["p50"] == pytest.approx(0.02)
    assert lv["errors"] == {"RESOURCE_EXHAUSTED": 2}
    # audio while the load was offered (sends from 0 to 1.5 s): the chunks at 0.1, 0.3, 0.6, 0.8, 1.1, 0.2 s each;
    # those at 1.6, 1.8 and 1.9 came after the last send
    assert lv["audio_x_realtime_offered"] == pytest.approx(5 * 0.2 / 1.5)
    table = report.goodput_table({"rate 4/s": lv})
    assert "3.3" in table and "1/2" in table and "0.7" in table


def test_capacity_is_the_largest_level_meeting_both_bounds():
    def level(share, p95, errors=0):
        return {"requests": 10, "ok": 10 - errors, "stall_free_share": share, "ttfa_seconds": {"p95": p95}}

    levels = {1: level(1.0, 0.05), 4: level(1.0, 0.1), 16: level(0.99, 0.29), 32: level(0.98, 0.2), 64: level(1.0, 0.4)}
    assert report.capacity(levels) == 16
    assert report.capacity({1: level(1.0, 0.05, errors=1)}) == 0


def test_poisson_arrivals_and_prompt_files(tmp_path):
    times = poisson_arrivals(rate=20.0, count=4000, seed=1)
    assert times == sorted(times) and times == poisson_arrivals(rate=20.0, count=4000, seed=1)
    assert times[-1] / len(times) == pytest.approx(1 / 20.0, rel=0.05)   # mean gap 1/rate
    (tmp_path / "p.txt").write_text("first prompt\n\n  second prompt  \n")
    assert load_prompts(str(tmp_path / "p.txt")) == ["first prompt", "second prompt"]
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(ValueError, match="no prompts"):
        load_prompts(str(tmp_path / "empty.txt"))
    assert len(load_prompts(None)) >= 8
    assert span("2-20") == (2.0, 20.0) and span("6") == (6.0, 6.0)
    for bad in ("20-2", "0-3", "a-b"):
        with pytest.raises(argparse.ArgumentTypeError):
            span(bad)


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "services.cli", "bench", "--no-progress", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_bench_against_the_tiny_stack(stack, tmp_path):
    tokens = 10
    started = time.time()
    proc = bench("--target", stack.target("gateway"), "--concurrency", "1,3", "--requests", "6",
                 "--max-new-tokens", str(tokens), "--warmup", "1", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "TTFA p50" in proc.stdout and "capacity" in proc.stdout
    result = json.loads((tmp_path / "bench.json").read_text())
    assert list(result["levels"]) == ["1", "3"]
    # each level's start on the wall clock (what the stages' samples beside it are timed by: bench/timeline.py),
    # the second after the first has run its wall time
    one, three = (result["levels"][k] for k in ("1", "3"))
    assert started < one["started_unix"] < one["started_unix"] + one["summary"]["wall_seconds"] <= three["started_unix"]
    for level in result["levels"].values():
        lv, streams = level["summary"], level["streams"]
        assert lv["requests"] == len(streams) == 6 and lv["ok"] + sum(lv["errors"].values()) == 6
        assert lv["ok"] == 6 and all(s["code"] == "OK" for s in streams)
        # Every stream carries its fixed length of audio, as the chunks recorded it.
        assert all(sum(s["chunk_samples"]) == tokens * SAMPLES_PER_TOKEN for s in streams)
        assert lv["audio_seconds"] == pytest.approx(6 * tokens * 0.08)
        # Quantiles are ordered and come from the recorded first arrivals.
        ttfa = [s["chunk_arrivals_s"][0] for s in streams]
        q = lv["ttfa_seconds"]
        assert min(ttfa) <= q["p50"] <= q["p90"] <= q["p95"] <= q["p99"] <= max(ttfa)
        assert q["p50"] == pytest.approx(report.quantile(ttfa, 50))
        # Stalls recomputed from the arrival times agree with the summary.
        rebuilt = [StreamRecord(sent=0.0, sample_rate=s["sample_rate"],
                                chunks=list(zip(s["chunk_arrivals_s"], s["chunk_samples"]))) for s in streams]
        assert lv["stalls"] == sum(len(r.stalls()) for r in rebuilt)
        assert lv["stall_free_streams"] == sum(r.stall_free() for r in rebuilt)
        assert all(r.rtf > 0 for r in rebuilt)
        # Goodput recomputed from the recorded sends and arrivals agrees with the summary.
        sent = [s["sent_s"] for s in streams]
        assert lv["offered_per_second"] == pytest.approx((len(sent) - 1) / (max(sent) - min(sent)))
        assert lv["goodput_per_second"] == pytest.approx(sum(r.stall_free() for r in rebuilt) / lv["wall_seconds"])
        arrivals = [(s["sent_s"] + at, n / s["sample_rate"]) for s in streams
                    for at, n in zip(s["chunk_arrivals_s"], s["chunk_samples"])]
        offered = sum(a for at, a in arrivals if min(sent) <= at <= max(sent)) / (max(sent) - min(sent))
        assert lv["audio_x_realtime_offered"] == pytest.approx(offered)
        assert lv["refused"] == 0
        # Per-stage times come from the gateway's summaries: prefill within TTFA, TTFA within the total.
        st = lv["stages_mean_seconds"]
        assert 0 < st["llm_prefill_seconds"] <= st["ttfa_seconds"] <= st["total_seconds"]
        # ... and over the tenth of the streams whose first audio came last (here: the one slowest of 6)
        slowest = max(streams, key=lambda s: s["chunk_arrivals_s"][0])["stages"]
        assert lv["stages_slowest_tenth_seconds"] == pytest.approx({k: slowest[k] for k in report.STAGES})
        # Each chunk's slack by its place, from the recorded arrivals; the second chunk's parts from the summaries.
        second = [-r.lateness()[1] for r in rebuilt]
        assert lv["slack_by_place"]["2nd"]["chunks"] == 6
        assert lv["slack_by_place"]["2nd"]["p50"] == pytest.approx(report.quantile(second, 50))
        assert lv["second_chunk_mean_seconds"]["llm_second_chunk_seconds"] > 0
        # The gateway's slack for the second chunk (sent, against the audio it had sent) is the client's (arrived,
        # against the audio it had received) within loopback's delays; a late chunk on a busy 2-core machine is
        # still the same on both sides.
        gateway_second = [s["stages"]["second_chunk_slack_seconds"] for s in streams]
        assert all(abs(g - c) < 0.1 for g, c in zip(gateway_second, second)), (gateway_second, second)
    assert result["capacity"] in (0, 1, 3)
    assert "| streams |" in (tmp_path / "bench.md").read_text()
    assert "| 3 | 2nd | 6 |" in (tmp_path / "bench.md").read_text()
    for png in ("ttfa_distribution.png", "sweep.png", "goodput.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_ramp_spreads_the_starts_of_a_levels_streams(stack, tmp_path):
    proc = bench("--target", stack.target("gateway"), "--concurrency", "3", "--requests", "3", "--ramp", "0.9",
                 "--max-new-tokens", "4", "--warmup", "0", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    streams = json.loads((tmp_path / "bench.json").read_text())["levels"]["3"]["streams"]
    sent = [s["sent_s"] for s in streams]  # in request order: request k is slot k's first, sent k x 0.9 / 3 s in
    assert sent[0] == 0.0 and sent[1] >= 0.29 and sent[2] >= 0.59


def test_bench_on_poisson_arrivals_and_against_a_dead_target(stack, tmp_path):
    # --seconds of arrivals (at least 8 requests); --reply-seconds: each reply its own length, 2 to 10 tokens
    proc = bench("--target", stack.target("gateway"), "--rate", "16", "--seconds", "0.6", "--reply-seconds", "0.16-0.8",
                 "--warmup", "0", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "bench.json").read_text())
    (label, level), = result["levels"].items()
    assert label == "rate 16/s" and level["summary"]["ok"] == 10
    tokens = [sum(s["chunk_samples"]) // SAMPLES_PER_TOKEN for s in level["streams"]]
    assert all(sum(s["chunk_samples"]) % SAMPLES_PER_TOKEN == 0 for s in level["streams"])
    assert min(tokens) >= 2 and max(tokens) <= 10 and len(set(tokens)) >= 3, tokens
    assert result["reply_seconds"] == [0.16, 0.8]
    # Nothing listens on port 1: every request fails UNAVAILABLE, counted by code, and the exit status says so.
    proc = bench("--target", "127.0.0.1:1", "--requests", "3", "--warmup", "0", "--timeout", "5")
    assert proc.returncode == 1
    assert "UNAVAILABLE 3" in proc.stdout and math.isnan(report.quantile([], 50))


def test_the_first_chunk_size_goes_into_the_requests(stand_in_stack, tmp_path):
    """(The stand-in vocodes exactly the tokens a chunk brings, so a first chunk's audio shows how many tokens the llm's
    first chunk had; the codec's flow decodes in blocks of 5 tokens after 3 of look-ahead, which hides it.)"""
    first, per_token = {}, set()
    for tokens in (2, 5):
        out = tmp_path / str(tokens)
        proc = bench("--target", stand_in_stack.target("gateway"), "--concurrency", "1", "--requests", "1", "--max-new-tokens", "12",
                     "--first-chunk-tokens", str(tokens), "--warmup", "0", "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        stream = json.loads((out / "bench.json").read_text())["levels"]["1"]["streams"][0]
        first[tokens] = stream["chunk_samples"][0]
        assert sum(stream["chunk_samples"]) == stream["stages"]["num_samples"]
        per_token.add(stream["stages"]["num_samples"] // stream["stages"]["audio_tokens"])
    # the lookahead held back from a first chunk is the same either way: three more tokens, three tokens' samples more
    assert len(per_token) == 1 and first[5] - first[2] == 3 * per_token.pop()


def test_bench_converse_sessions_turn_after_turn(stack, tmp_path):
    """--turns: each request a Converse session; a turn goes out once the reply before it has played out at the
    client plus --turn-gap, its prompt carries the history, and every session ends."""
    tokens, gap = 6, 0.1
    proc = bench("--target", stack.target("gateway"), "--concurrency", "2", "--requests", "2", "--turns", "3",
                 "--turn-gap", str(gap), "--max-new-tokens", str(tokens), "--warmup", "0", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "bench.json").read_text())
    level = result["levels"]["2"]
    streams, lv = level["streams"], level["summary"]
    assert lv["requests"] == lv["ok"] == 6 and [s["turn"] for s in streams] == [1, 2, 3, 1, 2, 3]
    for session in (streams[:3], streams[3:]):
        for before, after in zip(session, session[1:]):
            played_out = before["sent_s"] + before["chunk_arrivals_s"][0] + tokens * 0.08
            assert after["sent_s"] >= played_out + gap - 0.01  # the listener heard the reply out, then spoke
            assert after["stages"]["prompt_tokens"] > before["stages"]["prompt_tokens"] + tokens  # the history
    assert sorted(lv["by_turn"]) == ["1", "2", "3"] and all(t["turns"] == 2 for t in lv["by_turn"].values())
    assert "Converse sessions, by turn" in (tmp_path / "bench.md").read_text()
    assert result["turns"] == 3
    text = scrape(stack.ports.metrics["gateway"])
    assert metric_value(text, "gateway_active_sessions") == 0
    assert metric_value(text, "gateway_sessions_ended_total", '{reason="closed"}') >= 2


def test_the_encoders_places_are_read_from_its_metrics_and_missing_ones_say_none():
    """services/bench/encoder_places.py: the two gauges parsed from a /metrics page; a page without them, or no server
    at all, reads as None (the bench then reports no places rather than zeros)."""
    import http.server
    import threading

    from services.bench.encoder_places import PlacesSampler, read
    from services.stack import free_port

    pages = {"/metrics": b"# HELP encoder_speakers x\nencoder_speakers 3.0\nencoder_speaker_places 32.0\n",
             "/other": b"gateway_turns 1.0\n"}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(pages.get(self.path, b""))

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert read(base + "/metrics") == (3.0, 32.0)
        assert read(base + "/other") is None
        assert read(f"http://127.0.0.1:{free_port()}/metrics", timeout=0.5) is None
        sampler = PlacesSampler(base + "/metrics", every=0.01).start()
        import time

        time.sleep(0.1)
        summary = sampler.stop()
        assert summary["peak"] == summary["mean"] == 3.0 and summary["of"] == 32.0 and summary["samples"] >= 2
        assert PlacesSampler(base + "/other").summary() is None
    finally:
        server.shutdown()
