"""bench/flow_steps_agreement.py: how far fewer Euler steps move the codec's output, measured so that the numbers mean
what they say (the tiny codec, random weights, CPU: the plumbing, not a judgement)."""

from __future__ import annotations

import json
import math
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import flow_steps_agreement as fsa  # noqa: E402

from services.vocoder.loader import load_vocoder  # noqa: E402


def test_a_log_mel_ten_times_louder_is_20_db_away_over_the_frames_both_have():
    a = torch.zeros(6, 4)
    b = torch.full((4, 4), math.log(10.0))  # natural log of the magnitude, as the flow's mel
    assert fsa.mean_db(a, b) == pytest.approx(20.0)
    assert fsa.mean_db(b, b) == 0.0


def write_tone(path: Path, seconds: float = 1.5, rate: int = 16_000) -> None:
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())


def test_each_steps_count_decodes_the_same_tokens_and_only_the_reference_is_itself(tmp_path, monkeypatch):
    built = []  # each vocoder's flow options: no stream history (offline; at the real size it held ~20 GB on a CPU)

    def recorded(*args, flow, **kwargs):
        built.append(flow)
        return load_vocoder(*args, flow=flow, **kwargs)

    monkeypatch.setattr(fsa, "load_vocoder", recorded)
    write_tone(tmp_path / "tone.wav")
    (tmp_path / "tokens.json").write_text(json.dumps([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26] * 2]))
    out = tmp_path / "steps.json"
    assert fsa.main(["--steps", "10,5", "--wav", str(tmp_path / "tone.wav"), "--tokens-file", str(tmp_path / "tokens.json"),
                     "--random", "1", "--wav-dir", str(tmp_path / "wavs"), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {(r["utterance"], r["steps"]): r for r in result["rows"]}
    assert set(rows) == {(u, s) for u in ("tone", "tokens0", "random0") for s in (10, 5)}
    for u in ("tone", "tokens0", "random0"):
        assert rows[u, 10]["mel_db"] == rows[u, 10]["audio_db"] == 0.0  # the reference against itself
        assert rows[u, 5]["mel_db"] > 0 and rows[u, 5]["audio_db"] > 0  # five steps are another solve
    # Speech came with its source: both steps counts are measured against it; token lists have none.
    assert all(math.isfinite(rows["tone", s]["source_db"]) for s in (10, 5))
    assert rows["tokens0", 5]["source_db"] is None and result["reference_steps"] == 10
    assert [s["steps"] for s in result["summary"]] == [10, 5]
    assert [(f.n_timesteps, f.history_streams) for f in built] == [(None, 0), (5, 0)]  # (None: the checkpoint's 10)
    # A WAV per decode, as long as its tokens: 24 tokens of 0.08 s at 24 kHz.
    with wave.open(str(tmp_path / "wavs" / "tokens0_steps5.wav")) as w:
        assert (w.getframerate(), w.getnframes()) == (24_000, 24 * 1920)


@pytest.mark.parametrize("tokens, steps", [([[1, 2, 99999]], "10,5"), ([[]], "10,5"), ([[1, 2, 3]], "10,10")])
def test_bad_input_is_said_not_decoded(tmp_path, tokens, steps):
    (tmp_path / "tokens.json").write_text(json.dumps(tokens))
    with pytest.raises(SystemExit) as info:
        fsa.main(["--steps", steps, "--tokens-file", str(tmp_path / "tokens.json")])
    assert "flow_steps_agreement:" in str(info.value)
