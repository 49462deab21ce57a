"""bench/restart_report.py: a start's and a kill's times read back from the stack's log and a load's bench.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


def stamp(seconds: float) -> str:
    import datetime

    when = datetime.datetime.fromtimestamp(T0 + seconds, datetime.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M:%S,") + f"{when.microsecond // 1000:03d}"


def report(tmp_path) -> tuple[dict, str]:
    """bench/restart_report.py run on tmp_path → (its JSON, its printed table)."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "restart_report.py"), str(tmp_path), "--json",
                          str(tmp_path / "r.json")], capture_output=True, text=True, check=True).stdout
    return json.loads((tmp_path / "r.json").read_text()), out


def test_a_start_and_a_kill_that_faulted_the_other_stage(tmp_path):
    (tmp_path / "up_warm.log").write_text(
        f"{stamp(20.5)} INFO services.common.server: vocoder serving on 127.0.0.1:50053\n"
        f"{stamp(14.25)} INFO services.common.server: llm serving on 127.0.0.1:50052\n")
    kill = 100.0
    (tmp_path / "log_kill_1.txt").write_text(
        f"{stamp(kill + 0.1)} INFO services.gateway.backends: gateway: vocoder at 127.0.0.1:50053 is NOT ready\n"
        "moss-serve up: vocoder exited with code -9; starting it again in 1 s\n"
        "moss-serve up: llm exited with code 3; starting it again in 1 s\n"
        f"{stamp(kill + 28.1)} INFO services.gateway.backends: gateway: vocoder at 127.0.0.1:50053 is ready\n")
    began = T0 + kill - 8
    streams = [dict(code="OK", sent_s=1.0, chunk_arrivals_s=[0.1]),             # before the kill: not counted
               dict(code="OK", sent_s=9.0, chunk_arrivals_s=[27.5, 28.0]),      # sent 1 s after it: first audio 28.5 s
               dict(code="OK", sent_s=10.0, chunk_arrivals_s=[30.0]),
               dict(code="UNAVAILABLE", sent_s=8.5, chunk_arrivals_s=[])]
    (tmp_path / "load_1").mkdir()
    (tmp_path / "load_1" / "bench.json").write_text(json.dumps(
        dict(levels={"rate 10/s": dict(started_unix=began, streams=streams)})))
    (tmp_path / "events.tsv").write_text(f"start\twarm\t{T0}\t26.1\t94.2\nkill\tvocoder\t{T0 + kill}\tnull\t1\n")
    result, out = report(tmp_path)
    assert result["starts"] == [dict(start="warm", first_turn_s=26.1, every_graph_s=94.2, vocoder_serving_s=20.5,
                                     llm_serving_s=14.2)]
    assert result["kills"] == [dict(killed="vocoder", found_s=None, back_s=28.1, load_first_audio_s=28.5, say_s=None,
                                    session_s=None, session_history=None, session_note=None,
                                    faulted=["llm"], steps={})]  # (up's lines carried no time then: not found)
    assert "| vocoder | – | 28.1 s | 28.5 s | – | – | – | llm |" in out


def test_a_fault_on_purpose_is_back_when_the_later_of_llm_and_vocoder_is(tmp_path):
    fault = 50.0
    (tmp_path / "log_kill_2.txt").write_text(
        f"{stamp(fault + 0.2)} INFO services.gateway.admission: admission limit 11 -> 5 turns\n"
        f"{stamp(fault + 0.3)} CRITICAL services.llm.async_engine: llm: its GPU failed (CUDA error: an illegal memory "
        "access was encountered); restarting: failing every request and stopping\n"
        "moss-serve up: llm exited with code 3; starting it again at once\n"
        f"{stamp(fault + 9.4)} INFO services.gateway.backends: gateway: llm at 127.0.0.1:50052 is ready\n"
        f"{stamp(fault + 11.2)} INFO services.gateway.backends: gateway: vocoder at 127.0.0.1:50053 is ready\n")
    (tmp_path / "events.tsv").write_text(f"kill\tfault\t{T0 + fault}\t12.0\t2\t13.41 181 214 yes\n")
    result, out = report(tmp_path)
    assert result["kills"][0] == dict(killed="fault", found_s=0.3, back_s=11.2, load_first_audio_s=None, say_s=12.0,
                                   session_s=13.41, session_history="yes", session_note=None, faulted=["llm"], steps={})
    assert "| fault | 0.3 s | 11.2 s | – | 12.0 s | 13.41 s | yes | llm |" in out
    (tmp_path / "events.tsv").write_text(f"kill\tfault\t{T0 + fault}\t12.0\t2\tnull no turn answered in time\n")
    row = report(tmp_path)[0]["kills"][0]
    assert (row["session_s"], row["session_history"], row["session_note"]) == (None, None, "null no turn answered in time")
    (tmp_path / "events.tsv").write_text(f"kill\tfault\t{T0 + fault}\t12.0\t2\tTraceback (most recent call last):\n")
    assert report(tmp_path)[0]["kills"][0]["session_s"] is None  # whatever the probe left, the report is made

    (tmp_path / "log_kill_2.txt").write_text(  # the vocoder never came back: not back
        f"{stamp(fault + 9.4)} INFO services.gateway.backends: gateway: llm at 127.0.0.1:50052 is ready\n")
    assert report(tmp_path)[0]["kills"][0]["back_s"] is None


def test_a_kill_that_took_every_gpu_stage_is_back_when_the_later_one_is(tmp_path):
    """An llm's kill whose spare the faulted server refused: up stopped the vocoder too, which came back last."""
    kill = 50.0
    (tmp_path / "log_kill_1.txt").write_text(
        f"{stamp(kill + 0.5)} moss-serve up: llm exited with code 3; starting it again in 1 s\n"
        f"{stamp(kill + 0.5)} moss-serve up: llm died (3); stopping vocoder, encoder too: they share its GPU's MPS "
        "server, which it may have left faulted\n"
        f"{stamp(kill + 10.7)} INFO services.gateway.backends: gateway: llm at 127.0.0.1:50052 is ready\n"
        f"{stamp(kill + 14.2)} INFO services.gateway.backends: gateway: vocoder at 127.0.0.1:50053 is ready\n")
    (tmp_path / "events.tsv").write_text(f"kill\tllm\t{T0 + kill}\t21.4\t1\n")
    [row] = report(tmp_path)[0]["kills"]
    assert row["back_s"] == 14.2 and row["faulted"] == ["llm"] and row["found_s"] == 0.5


def test_each_gpu_stage_s_start_steps_are_read_from_its_log(tmp_path):
    """Where a restart's seconds went: each step the llm's and the vocoder's logs time, the first after the kill."""
    fault = 50.0
    lines = [
        "INFO services.llm.server: llm: its CUDA context made in 0.1 s",
        "INFO services.vocoder.server: vocoder: its CUDA context made in 0.2 s",
        "INFO services.llm.server: weights and KV cache in torch.bfloat16; the weights took 7.4 s",
        "INFO services.vocoder.loader: vocoder: the flow moved to cuda in 5.8 s; the voices' prompt prefix, the stream "
        "history and the generator set up in 3.3 s",
        "INFO services.llm.server: llm: the KV cache and the runner (its CUDA graphs on a GPU) ready in 2.8 s",
        "INFO services.llm.server: llm: warm-up of 74 synthetic turns in 0.7 s",
        "INFO services.vocoder.server: vocoder: 28 CUDA graphs captured before serving in 5.1 s, 190 to capture while "
        "serving (--graphs-before-serving covers)",
        "INFO services.llm.server: weights and KV cache in torch.bfloat16; the weights took 99.0 s",  # a later start
    ]
    (tmp_path / "log_kill_1.txt").write_text("".join(f"{stamp(fault + 1 + k)} {line}\n" for k, line in enumerate(lines)))
    (tmp_path / "events.tsv").write_text(f"kill\tfault\t{T0 + fault}\tnull\t1\n")
    result, out = report(tmp_path)
    assert result["kills"][0]["steps"] == {
        "llm context": 0.1, "llm weights": 7.4, "llm KV and runner": 2.8, "llm warm-up": 0.7, "vocoder context": 0.2,
        "vocoder flow move": 5.8, "vocoder voices, history, generator": 3.3, "vocoder covers": 5.1}
    assert "| fault | 0.1 s | 7.4 s | 2.8 s | 0.7 s | 0.2 s | 5.8 s | 3.3 s | 5.1 s |" in out


def test_the_fault_on_purpose_joins_the_stage_s_mps_server_or_refuses(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_fault import client_env

    stage = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"), "PATH": "/usr/bin", "HOME": "/x"})
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={"PATH": "/usr/bin"})
    try:
        assert client_env(stage.pid) == {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe")}
        refused = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_fault.py"), "--pid", str(plain.pid)],
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "no MPS client" in refused.stderr
    finally:
        stage.kill()
        plain.kill()


def test_the_answer_probe_says_null_when_nothing_answers_within_its_limit():
    import time

    from services.stack import free_port

    started = time.time()
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "answer_probe.py"), "--since", str(started),
                          "--target", f"127.0.0.1:{free_port()}", "--limit", "1.5", "--try-seconds", "0.5"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "null" and time.time() - started >= 1.5


def test_the_answer_probe_times_a_served_turn(stack):
    import time

    started = time.time()
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "answer_probe.py"), "--since", str(started),
                          "--target", stack.target("gateway"), "--limit", "60"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    assert 0 < float(out) < time.time() - started


def test_the_session_probe_finds_its_session_going_on_with_its_history_after_a_stage_s_restart(stack, tmp_path):
    """--session: a Converse session answered once before the llm went, tried through the llm's absence; its
    answered turn's prompt carries the first turn and its reply."""
    import time

    ready, since = tmp_path / "ready", tmp_path / "since"
    probe = subprocess.Popen([sys.executable, str(ROOT / "bench" / "answer_probe.py"), "--session", str(ready),
                              "--since-file", str(since), "--target", stack.target("gateway"), "--limit", "90",
                              "--try-seconds", "5"], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if ready.exists() and ready.read_text().strip():
                break
            assert probe.poll() is None, probe.stdout.read()
            time.sleep(0.1)
        first_prompt = int(ready.read_text())
        stack.stop("llm")
        since.write_text(f"{time.time()}\n")
        time.sleep(1.0)  # tries meet no llm: each fails and the session goes on
        stack.start("llm")
        stack.wait_serving(["llm"])
        out, _ = probe.communicate(timeout=120)
    finally:
        probe.kill()
        if "llm" not in stack.procs:  # the session's stack serves the next test
            stack.start("llm")
            stack.wait_serving(["llm"])
    seconds, first, answered, carried = out.split()
    assert float(seconds) >= 1.0 and int(first) == first_prompt
    assert carried == "yes" and int(answered) >= first_prompt + 8  # the first turn's 8 audio tokens at least
