"""A spare process (services/spare.py): it waits without serving, serves the command line it was made for when told,
and `moss-serve up --spares` restarts a dead service from its spare, then makes the next one."""

import os
import signal
import subprocess
import sys
import time

import pytest

from services.spare import Spare, driver_initialized
from services.stack import Ports, is_serving, listener_pid
from tests.test_supervisor import say


def test_a_spare_waits_then_runs_its_own_command_line(tmp_path):
    command = [sys.executable, "-m", "services.cli", "gateway", "--help"]
    env = {**os.environ}
    log = tmp_path / "spare.log"
    spare = Spare(command, env, open(log, "ab"))
    time.sleep(1.0)
    assert spare.proc.poll() is None  # waiting, not serving
    assert spare.fits(command, env)
    assert not spare.fits(command + ["--port", "1"], env)
    assert not spare.fits(command, {**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"})
    proc = spare.go()
    assert proc is spare.proc and proc.wait(60) == 0
    assert "usage: moss-serve gateway" in log.read_text()
    assert spare.go() is None  # it has exited: it cannot serve again


def test_a_spare_set_aside_ends_at_once_and_one_told_nothing_exits_quietly(tmp_path):
    command = [sys.executable, "-m", "services.cli", "vocoder", "--help"]
    spare = Spare(command, dict(os.environ), open(tmp_path / "a.log", "ab"))
    spare.discard()
    assert spare.proc.returncode == -signal.SIGKILL
    quiet = subprocess.run([sys.executable, "-m", "services.spare", "vocoder", "--help"], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0 and "usage" not in quiet.stdout  # EOF before `go`: it never ran the command


def test_a_spare_knows_whether_the_cuda_driver_was_initialised():
    assert not driver_initialized()  # this process: its imports (torch's included) made no CUDA call
    if not os.path.exists("/dev/nvidiactl"):  # no GPU here: the driver's library cannot even be loaded
        import ctypes

        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError:
            return
        raise AssertionError("libcuda.so.1 loads on a machine without a GPU: check driver_initialized() here")


def spares_of(parent: int, *serving: int) -> dict[str, set[int]]:
    """service → pids of the spares whose parent is `parent`, but those `serving` (a spare that serves keeps its
    command line)."""
    found: dict[str, set[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode() for a in f.read().split(b"\0")]
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and "services.spare" in argv and int(entry) not in serving:
            found.setdefault(argv[argv.index("services.spare") + 1], set()).add(int(entry))
    return found


def test_up_restarts_a_dead_service_from_its_spare_and_makes_the_next(tmp_path):
    from services.stack import SPARES_EACH

    ports = Ports.free()
    flags = []
    for service in ("gateway", "llm", "vocoder"):
        flags += [f"--{service}-port", str(ports.grpc[service]), f"--{service}-metrics-port", str(ports.metrics[service])]
    flags += ["--http-port", "0", "--no-encoder", "--spares"]
    log = tmp_path / "up.log"
    up = subprocess.Popen([sys.executable, "-m", "services.cli", "up", *flags], stderr=open(log, "w"))
    gateway = f"127.0.0.1:{ports.grpc['gateway']}"

    def all_kept(spares):
        return len(spares) == 2 and all(len(pids) == SPARES_EACH for pids in spares.values())

    try:
        deadline = time.monotonic() + 180
        while not is_serving(gateway) or "Ctrl-C stops" not in log.read_text() or not all_kept(spares_of(up.pid)):
            assert up.poll() is None and time.monotonic() < deadline, "no stack with its spares:\n" + log.read_text()
            time.sleep(0.3)
        spares = spares_of(up.pid)
        assert set(spares) == {"llm", "vocoder"}, spares
        llm = listener_pid(ports.grpc["llm"])
        assert llm is not None and not any(llm in pids for pids in spares.values())

        os.kill(llm, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while listener_pid(ports.grpc["llm"]) in (None, llm):
            assert time.monotonic() < deadline, "the llm's port was never served again:\n" + log.read_text()
            time.sleep(0.1)
        serving = listener_pid(ports.grpc["llm"])
        assert serving in spares["llm"]  # a spare serves, under its own pid
        assert "llm started again from its spare" in log.read_text()
        assert say(gateway) > 0
        while not all_kept(now := spares_of(up.pid, serving)):  # and the next spare is made
            assert time.monotonic() < deadline, f"no new spare for the llm: {now}"
            time.sleep(0.2)
        assert now["llm"] - spares["llm"] and now["llm"] & spares["llm"]  # one new, the other kept
        assert now["vocoder"] == spares["vocoder"]  # the vocoder's left as they were

        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0
        left = [pid for pid in [*now["llm"], *now["vocoder"], serving] if os.path.exists(f"/proc/{pid}")
                and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
        assert left == [], "spares outlived moss-serve up"
    finally:
        if up.poll() is None:
            up.kill()
        for pids in spares_of(up.pid).values():
            for pid in pids:
                os.kill(pid, signal.SIGKILL)


def test_a_stack_gives_up_on_spares_that_keep_dying(tmp_path, monkeypatch, capsys):
    from services.stack import SPARE_TRIES, SPARES_EACH, Stack

    # Every spare "has initialised the driver" (its services.spare patched by a sitecustomize): each exits 1.
    (tmp_path / "sitecustomize.py").write_text("import services.spare\nservices.spare.driver_initialized = lambda: True\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    stack = Stack(Ports.free(), log_dir=tmp_path, spares=("llm",), without=("encoder",))
    stack.procs["llm"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        made = []
        for _ in range(SPARE_TRIES + 2):
            stack.keep_spares()
            kept = stack.spares.get("llm", [])
            assert len(kept) in (0, SPARES_EACH)
            for spare in kept:
                made.append(spare.proc.pid)
                assert spare.proc.wait(120) == 1  # it saw "the driver" and exited
        stack.keep_spares()
        # made in rounds of SPARES_EACH until SPARE_TRIES of them had died
        assert len(made) == -(-SPARE_TRIES // SPARES_EACH) * SPARES_EACH and not stack.spares["llm"]
        assert (tmp_path / "llm.log").read_text().count("an import initialised the CUDA driver") == len(made)
        assert f"llm's spares exited by themselves {SPARE_TRIES} times" in capsys.readouterr().err
    finally:
        stack.procs["llm"].kill()
        stack.drop_spares()


def test_a_start_takes_the_oldest_spare_that_still_waits(tmp_path):
    """A spare that exited (or no longer fits its command) is set aside, and the next one serves."""
    from services.stack import Stack

    stack = Stack(Ports.free(), log_dir=tmp_path, spares=("llm",), without=("encoder",))
    stack.procs["llm"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stack.keep_spares()
        first, second = stack.spares["llm"]
        first.proc.kill()
        first.proc.wait()
        stack.procs["llm"].kill()
        assert stack.start("llm")  # the second served
        assert stack.procs["llm"] is second.proc and stack.spares["llm"] == []
    finally:
        for proc in stack.procs.values():
            proc.kill()
        stack.drop_spares()


def test_a_codec_read_ahead_is_what_the_next_load_serves(tmp_path):
    """The codec built on the CPU ahead (a vocoder's spare does so) is the one load_vocoder then serves, once: the
    same modules, the same weights as a load without it, and no device touched meanwhile."""
    from services.vocoder import loader as v
    from services.vocoder.codec.checkpoint import random_codec, save_codec
    from services.vocoder.codec.config import PRESETS

    assert v.codec_ahead(None, "tiny-codec", 3)
    ahead = v.CODEC.kept[(None, "tiny-codec", 3)][0]
    served = v.load_vocoder(None, "tiny-codec", seed=3)
    assert served.decoder.flow is ahead and not v.CODEC.kept
    fresh = v.load_vocoder(None, "tiny-codec", seed=3)  # nothing ahead: built now, and alike
    assert fresh.decoder.flow is not ahead
    for (name, a), b in zip(ahead.state_dict().items(), fresh.decoder.flow.state_dict().values()):
        assert a.equal(b), name
    assert not v.codec_ahead(None, "tiny", 0)  # the stand-in has no codec to read

    cfg = PRESETS["tiny"]()
    save_codec(*random_codec(cfg, 5), cfg, tmp_path / "codec")
    assert v.codec_ahead(tmp_path / "codec", "moss-speech", 0)  # a codec directory: read from its files
    flow = v.CODEC.kept[(str(tmp_path / "codec"), "moss-speech", 0)][0]
    assert v._take_codec(tmp_path / "codec", "moss-speech", 0)[0] is flow and not v.CODEC.kept


def test_an_encoder_read_ahead_is_what_the_next_load_serves():
    from services.encoder import server as e
    from services.encoder.settings import EncoderSettings

    s = EncoderSettings(preset="tiny", device="cpu")
    assert e.model_ahead(s)
    ahead = e.MODEL.kept[(None, "tiny", 0)]
    assert e.load_encoder(s) is ahead and not e.MODEL.kept  # (on the CPU, .to() keeps the module)
    fresh = e.load_encoder(s)
    assert fresh is not ahead
    for (name, a), b in zip(ahead.state_dict().items(), fresh.state_dict().values()):
        assert a.equal(b), name


@pytest.mark.parametrize("service, preset, what", [("vocoder", "tiny-codec", "the vocoder's codec"),
                                                   ("encoder", "tiny", "the encoder's weights")])
def test_a_spare_serves_what_it_read_ahead(tmp_path, service, preset, what):
    from services.stack import free_port

    port, metrics = free_port(), free_port()
    command = [sys.executable, "-m", "services.cli", service, "--host", "127.0.0.1", "--port", str(port),
               "--metrics-port", str(metrics), "--preset", preset]
    log = tmp_path / f"{service}.log"
    spare = Spare(command, dict(os.environ), open(log, "ab"))
    try:
        time.sleep(1.0)
        assert spare.proc.poll() is None
        proc = spare.go()
        deadline = time.monotonic() + 120
        while not is_serving(f"127.0.0.1:{port}"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert f"{what} was read ahead (a spare's)" in log.read_text()
    finally:
        spare.discard()


def test_the_llm_spare_imports_what_its_start_s_meta_build_would():
    """The llm's start from a checkpoint builds its model on the meta device (the checkpoint's keys checked before a
    byte is allocated), and the first meta initialisation imports torch._dynamo, ~1 s: a spare has it imported
    already."""
    code = ("import importlib, sys, torch\n"
            "from services.spare import PRELOAD\n"
            "for m in PRELOAD['llm']: importlib.import_module(m)\n"
            "from services.llm.model.config import preset\n"
            "from services.llm.model.model import MossSpeechForCausalLM\n"
            "before = set(sys.modules)\n"
            "with torch.device('meta'): MossSpeechForCausalLM(preset('tiny'))\n"
            "print(sorted(m for m in set(sys.modules) - before if m.startswith('torch')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip() == "[]", f"the meta build imported: {out}"
