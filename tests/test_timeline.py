"""bench/timeline.py, the sampler bench/overload.sh runs beside each gateway's loads: a real process scraping three
loopback metrics pages every half second into a TSV that bench/overload_report.py reads."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report, timeline = load("overload_report"), load("timeline")


def serve(page) -> ThreadingHTTPServer:
    """A metrics page on a free loopback port: page() gives its text at each scrape."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = page().encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_the_sampler_writes_each_stages_counters_as_they_grow(tmp_path):
    started = time.time()
    gateway = serve(lambda: "gateway_admission_limit 48.0\ngateway_active_requests 3.0\ngateway_queued_turns 0.0\n")
    # the llm's steps take 40% of the time since start; the vocoder is down (its columns stay empty)
    llm = serve(lambda: (f"llm_step_seconds_sum {0.4 * (time.time() - started)}\nllm_step_seconds_count 7.0\n"
                         f'llm_batch_size_sum 70.0\nllm_paced_seconds_total 0.0\nllm_requests_total{{code="OK"}} 1.0\n'))
    out = tmp_path / "timeline.tsv"
    ports = [str(s.server_address[1]) for s in (gateway, llm)]
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "timeline.py"), str(out), *ports, "1"])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(report.read_timeline(out)) < 4:
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        gateway.shutdown()
        llm.shutdown()
    rows = report.read_timeline(out)
    assert len(rows) >= 4, out.read_text()
    assert out.read_text().splitlines()[0].split("\t") == ["t", *timeline.GATEWAY, *timeline.LLM, *timeline.VOCODER,
                                                          *timeline.LANE, *timeline.CALL_PARTS]
    assert all(r["gateway_admission_limit"] == 48 and r["llm_batch_size_sum"] == 70 for r in rows)
    assert not any(name in r for r in rows for name in timeline.VOCODER)  # port 1: nothing answers
    gaps = [b["t"] - a["t"] for a, b in zip(rows, rows[1:])]
    assert all(0.4 < g < 1.0 for g in gaps), gaps
    busy = [(b["llm_step_seconds_sum"] - a["llm_step_seconds_sum"]) / (b["t"] - a["t"]) for a, b in zip(rows, rows[1:])]
    assert all(0.3 < x < 0.5 for x in busy), busy
