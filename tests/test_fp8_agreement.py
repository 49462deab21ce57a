"""bench/fp8_agreement.py: how far FP8 moves the llm's replies, measured so that the numbers mean what they say."""

from __future__ import annotations

import json
import sys
import wave
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import fp8_agreement as fa  # noqa: E402

from services.bench.workload import PROMPTS  # noqa: E402
from services.llm.model.config import tiny_config  # noqa: E402


def reply(tokens: list[int], logits: list[list[float]]) -> fa.Reply:
    return fa.Reply([7] * len(tokens), tokens, [torch.tensor(x) for x in logits])


def test_two_replies_are_compared_up_to_and_including_their_first_different_token():
    same = [[0.0, 1.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0]]
    model = reply([1, 0, 2, 0], same)
    assert fa.compare(0, model, reply([1, 0, 2, 0], same), 1.0) == fa.Agreement(
        0, 4, 4, None, 4, 1.0, 0.0, 0.0, [1, 0, 2, 0], [1, 0, 2, 0])
    moved = [same[0], [2.0, 0.0, 0.1], [0.0, 3.0, 2.9], [9.0, 9.0, 9.0]]  # parts at step 2; step 3 saw other input
    got = fa.compare(1, model, reply([1, 0, 1, 1], moved), 1.0)
    assert (got.first_difference, got.compared, got.top1) == (2, 3, pytest.approx(2 / 3))
    assert got.kl > 0 and got.max_relative_error == pytest.approx(9.01**0.5 / 3)  # step 2: |(0,3,-0.1)| / |(0,0,3)|
    shorter = fa.compare(2, model, reply([1, 0], same[:2]), 1.0)  # it stopped where the model went on
    assert (shorter.first_difference, shorter.compared) == (2, 2)


def test_an_audio_step_is_weighed_as_the_sampler_weighs_it():
    cfg = tiny_config()
    logits = torch.zeros(cfg.audio_vocab_size)
    logits[cfg.audio_logits_limit] = 50.0  # never sampled: past the limit
    view = fa.as_sampled(cfg, 0, logits, min_new_tokens=1)
    assert view.numel() == cfg.audio_logits_limit and view[cfg.eosp_token_id] == float("-inf")
    assert fa.as_sampled(cfg, 1, logits, min_new_tokens=1)[cfg.eosp_token_id] == 0.0  # eosp allowed from then on
    text = torch.zeros(cfg.vocab_size)
    assert fa.as_sampled(cfg, 0, text, 1) is text


def test_on_the_tiny_model_greedy_replies_part_exactly_where_their_heads_first_disagree(tmp_path):
    """The whole tool on a CPU: under greedy decoding a reply keeps the model's token exactly while both heads' largest
    logit agree, so top-1 over the compared steps is 1 less one step per reply that parted; FP8 moves the numbers a
    little, not a lot; each sampled pair of replies is written as WAVs of its codes' length."""
    out, prompts = tmp_path / "fa.json", tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS[:4]) + "\n")  # (half the built-in ones: the test's time on a 2-core machine)
    fa.main(["--preset", "tiny", "--max-new-tokens", "24", "--json", str(out), "--vocoder-preset", "tiny-codec",
             "--wav-dir", str(tmp_path / "wavs"), "--prompts", str(prompts)])
    results = json.loads(out.read_text())
    greedy = results["modes"]["greedy"]
    parted = sum(r["first_difference"] is not None for r in greedy["replies"])
    compared = greedy["summary"]["steps_compared"]
    assert len(greedy["replies"]) == 4 and compared >= 4 * 10
    assert greedy["summary"]["top1"] == pytest.approx((compared - parted) / compared)
    for mode in ("greedy", "sampled"):
        assert 0 < results["modes"][mode]["summary"]["kl_mean"] < 1e-2
        assert 0 < results["modes"][mode]["summary"]["max_relative_error"] < 0.1
    cfg = tiny_config()
    wavs = results["wavs"]
    assert len(wavs) == 2 * len(results["modes"]["sampled"]["replies"])
    first = results["modes"]["sampled"]["replies"][0]
    codes = [t for t in first["audio_ids"] if 0 <= t < cfg.eosp_token_id]
    with wave.open(wavs[0]) as w:
        assert w.getnframes() == len(codes) * 1920 and w.getframerate() == 24000
