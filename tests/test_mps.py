"""`moss-serve up --mps`: the CUDA MPS daemon's life around the stack. No GPU here, so a stand-in for
nvidia-cuda-mps-control plays its part: with -f it opens <pipe>/control and runs until a client sends
`quit` on stdin. Whether MPS itself shares the GPU is measured on a GPU (docs/benchmarks.md)."""

import os
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from services.cli import main
from services.mps import MpsDaemon, MpsUnavailable

STAND_IN = textwrap.dedent("""\
    #!{python}
    import os, sys, time
    pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
    if sys.argv[1:] == ["-f"]:
        if os.environ.get("FAIL_AT_START"):
            sys.exit(3)
        open(os.path.join(pipe, "control"), "w").close()
        while not os.path.exists(os.path.join(pipe, "quit")):
            time.sleep(0.02)
    elif sys.stdin.read().strip() == "quit":
        open(os.path.join(pipe, "quit"), "w").close()
""")


@pytest.fixture
def stand_in(tmp_path):
    path = tmp_path / "nvidia-cuda-mps-control"
    path.write_text(STAND_IN.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_daemon_starts_serves_its_own_pipe_directory_and_quits(stand_in, tmp_path):
    daemon = MpsDaemon(binary=stand_in)
    with daemon:
        env = daemon.env()
        assert (daemon.root / "pipe" / "control").exists()
        assert env["CUDA_MPS_PIPE_DIRECTORY"].startswith(str(daemon.root))
        # a client started with env() sees the daemon's directory
        out = subprocess.run([sys.executable, "-c", "import os; print(os.environ['CUDA_MPS_PIPE_DIRECTORY'])"],
                             env={**os.environ, **env}, capture_output=True, text=True, check=True).stdout.strip()
        assert out == env["CUDA_MPS_PIPE_DIRECTORY"]
        proc = daemon.proc
        assert proc.poll() is None
    assert proc.poll() == 0  # it quit when asked, not killed
    assert not daemon.root.exists()  # its temporary directory is gone


def test_daemon_that_dies_at_start_is_reported(stand_in, monkeypatch):
    monkeypatch.setenv("FAIL_AT_START", "1")
    with pytest.raises(MpsUnavailable, match="exited with code 3"):
        MpsDaemon(binary=stand_in).start()


def test_no_daemon_binary_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(MpsUnavailable, match="nvidia-cuda-mps-control not found"):
        MpsDaemon().start()


def test_up_refuses_mps_without_cuda(capsys):
    t0 = time.monotonic()
    assert main(["up", "--mps"]) == 2
    assert "--mps needs --device cuda" in capsys.readouterr().err
    assert time.monotonic() - t0 < 5  # refused before anything started


def test_each_services_share_of_the_gpu_goes_into_its_environment():
    """--mps-llm-threads and --mps-vocoder-threads become each process's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; at 100
    (the vocoder's default) a process gets none, so it may use every multiprocessor."""
    from services.cli import parser
    from services.up import mps_env

    class Daemon:
        def env(self):
            return {"CUDA_MPS_PIPE_DIRECTORY": "/p"}

    def shares(*flags):
        env = mps_env(parser().parse_args(["up", "--device", "cuda", *flags]), Daemon())
        return {name: e.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") for name, e in env.items()}

    assert shares() == {"llm": "25", "vocoder": None, "encoder": None}
    assert shares("--mps-vocoder-threads", "75", "--mps-llm-threads", "100") == {"llm": None, "vocoder": "75",
                                                                              "encoder": None}
    assert mps_env(parser().parse_args(["up"]), None) == {}


def test_an_llm_that_follows_the_load_runs_at_100_and_takes_its_share_itself(monkeypatch, capsys):
    """--mps-llm-follows-load (the default): where green contexts can be made the llm gets no MPS cap and
    --busy-share of --mps-llm-threads; where they cannot, or with --no-mps-llm-follows-load, the cap as before."""
    from services import up
    from services.cli import parser
    from services.common import green_context

    class Daemon:
        def env(self):
            return {"CUDA_MPS_PIPE_DIRECTORY": "/p"}

    args = parser().parse_args(["up", "--device", "cuda"])
    monkeypatch.setattr(green_context, "unavailable", lambda: None)
    assert up.llm_follows_load(args, Daemon())
    assert "take the whole GPU while at most 2 sequences ran in the last 2 s, else 25%" in capsys.readouterr().err
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in up.mps_env(args, Daemon(), llm_follows_load=True)["llm"]
    assert not up.llm_follows_load(args, None)  # no MPS: nothing shares the GPU's multiprocessors
    assert not up.llm_follows_load(parser().parse_args(["up", "--device", "cuda", "--no-mps-llm-follows-load"]),
                                   Daemon())
    monkeypatch.setattr(green_context, "unavailable", lambda: "the CUDA driver is 12.2; green contexts need 12.4")
    assert not up.llm_follows_load(args, Daemon())
    assert "on at most 25% of the multiprocessors at every load: the CUDA driver is 12.2" in capsys.readouterr().err


def test_up_refuses_a_share_that_is_not_a_percentage(capsys):
    assert main(["up", "--device", "cuda", "--mps", "--mps-vocoder-threads", "0"]) == 2
    assert "--mps-vocoder-threads is a percentage, 1 to 100" in capsys.readouterr().err


@pytest.mark.parametrize("under_mps, code", [(False, 2), (True, 3)])
def test_a_gpu_stage_refused_its_gpu_under_mps_says_its_gpu_is_lost(tmp_path, under_mps, code):
    """Under up's MPS daemon a GPU that is not there at a stage's start is a server taking no new client (faulted):
    exit 3, so that up's MpsKeeper stops the clients still holding it. Elsewhere a plain usage error (2). (This CPU
    torch is built without CUDA: the same check refuses it.)"""
    env = {**os.environ, **({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)} if under_mps else {})}
    env.pop("CUDA_MPS_PIPE_DIRECTORY", None) if not under_mps else None
    done = subprocess.run([sys.executable, "-m", "services.cli", "llm", "--device", "cuda", "--preset", "tiny",
                           "--port", "0"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert "moss-serve llm: --device cuda:" in done.stderr
    assert ("takes no new client" in done.stderr) == under_mps
