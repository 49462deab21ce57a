"""Seamless streaming: the receptive field the streamer's context is sized from, streamed against offline
synthesis for several chunk schedules (1-token chunks included), exact lengths, and generator checkpoints
in every weight-norm form. CPU, float32, random weights: the tiny preset, and the 24 kHz hop-480 preset
at 64 channels (same kernels, strides and dilations: same receptive field and length rules)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from services.vocoder import generator as gen
from services.vocoder.loader import _random_decoder_for
from services.vocoder.receptive_field import receptive_field
from services.vocoder.streamer import DEFAULT_LOOKAHEAD, MelStreamer
from services.vocoder.vocoder import TokenVocoder

# (1-token chunks for the first 14 tokens: every window then is one token's frames with the whole context; CI time)
SCHEDULES = {"1-token chunks": [1] * 14 + [10], "irregular": [3, 1, 5, 2, 1, 7, 4, 1], "one chunk": [24]}


def config(preset: str, channels: int | None = None):
    h = gen.preset_config(preset)
    if channels:
        h["upsample_initial_channel"] = channels
    return h


def vocoder_for(h, seed: int = 0) -> TokenVocoder:
    return TokenVocoder(_random_decoder_for(h, 1024, 32, seed), gen.build_generator(h, seed=seed), torch.device("cpu"))


@pytest.fixture(scope="module", params=[("tiny", None), ("moss-speech", 64)], ids=["tiny", "hop480"])
def vocoder(request):
    return vocoder_for(config(*request.param))


def snr_db(reference: np.ndarray, x: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference**2) / max(np.sum((reference - x) ** 2), 1e-30)))


def stream(vocoder, tokens, schedule, **context) -> np.ndarray:
    streamer, pieces, i = MelStreamer(vocoder, **context), [], 0
    for n in schedule:
        pieces.append(streamer.push(tokens[i : i + n]))
        i += n
    return np.concatenate(pieces + [streamer.flush()])


def tokens_for(vocoder, n=24, seed=0) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocoder.codebook_size, n).tolist()


@pytest.mark.parametrize("preset", [("tiny", None), ("moss-speech", 64)])
def test_receptive_field_is_what_the_gradient_sees(preset):
    """Frames whose mel reaches one frame's samples (a gradient probe through the real generator)."""
    h = config(*preset)
    model = gen.build_generator(h, seed=1).double()
    hop, frames, probe = vocoder_for(h).hop_size, 101, 50
    mel = torch.randn(1, h["num_mels"], frames, dtype=torch.float64, requires_grad=True)
    model(mel)[0, 0, probe * hop : (probe + 1) * hop].sum().backward()
    reached = (mel.grad[0].abs().sum(0) > 0).nonzero().flatten()
    assert (probe - int(reached.min()), int(reached.max()) - probe) == receptive_field(h)


def test_receptive_fields_of_the_presets():
    assert receptive_field(config("tiny")) == (8, 8)
    assert receptive_field(config("moss-speech")) == (30, 29)  # 600 ms before, 580 ms after


@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
def test_with_the_whole_receptive_field_a_stream_is_offline_synthesis(vocoder, schedule):
    tokens = tokens_for(vocoder)
    offline = vocoder.waveform(vocoder.mel(tokens))
    left, right = vocoder.receptive_field
    streamed = stream(vocoder, tokens, schedule, left_context=left, lookahead=right)
    assert len(streamed) == len(offline) == len(tokens) * vocoder.samples_per_token
    np.testing.assert_allclose(streamed, offline, rtol=0, atol=2e-5 * np.abs(offline).max())


# (1-token chunks: the exactness test above holds them to offline synthesis; here the two others, for CI's time)
@pytest.mark.parametrize("schedule", [SCHEDULES["irregular"], SCHEDULES["one chunk"]], ids=["irregular", "one chunk"])
def test_default_context_stays_above_40_db(vocoder, schedule):
    tokens = tokens_for(vocoder, seed=1)
    offline = vocoder.waveform(vocoder.mel(tokens))
    streamed = stream(vocoder, tokens, schedule)
    assert len(streamed) == len(offline)
    assert snr_db(offline, streamed) >= 40.0
    # … and the context is what does it: without any, the same schedule is far worse (1-token chunks).
    if schedule == SCHEDULES["1-token chunks"]:
        assert snr_db(offline, stream(vocoder, tokens, schedule, left_context=0, lookahead=0)) < 30.0


def test_defaults_come_from_the_generator(vocoder):
    streamer = MelStreamer(vocoder)
    assert (streamer.left_context, streamer.lookahead) == (vocoder.receptive_field[0], DEFAULT_LOOKAHEAD)


def test_the_hop480_preset_yields_frames_times_hop_samples():
    """Its upsample kernels exceed their strides by odd numbers (10-5, 6-3): the generator itself adds
    104 samples after the last frame's, which the vocoder cuts."""
    v = vocoder_for(config("moss-speech", 64))
    mel = v.mel([1, 2, 3])
    with torch.no_grad():
        raw = v.generator(mel[None]).shape[-1]
    assert raw == 12 * 480 + 104 and len(v.waveform(mel)) == 12 * 480


@pytest.mark.parametrize("form", ["g_v", "parametrizations", "plain"])
def test_generator_checkpoints_in_every_weight_norm_form(form):
    h = config("tiny")
    import bigvgan

    torch.manual_seed(3)
    trained = bigvgan.BigVGAN(h)  # the package's weight_norm (weight_g / weight_v)
    state = trained.state_dict()
    if form == "parametrizations":
        state = {k.replace(".weight_g", ".parametrizations.weight.original0")
                  .replace(".weight_v", ".parametrizations.weight.original1"): v for k, v in state.items()}
    with torch.no_grad():
        trained.remove_weight_norm()
    if form == "plain":
        state = trained.state_dict()
    mel = torch.randn(1, h["num_mels"], 9)
    with torch.no_grad():
        want = trained.eval()(mel)
        got = gen.build_generator(h, state)(mel)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match="Missing key"):
        gen.build_generator(h, {k: v for k, v in state.items() if not k.startswith("conv_post")})


def test_a_window_gives_the_same_samples_alone_or_batched(vocoder):
    """Windows of several lengths (several frames buckets, one past the largest) in one call: each equals
    its run alone; a stream's last window equals plain synthesis of it."""
    g = torch.Generator().manual_seed(4)
    windows = [torch.randn(80, n, generator=g) - 5 for n in (3, 12, 12, 16, 40, 130, 7)]
    last = [False, False, False, True, False, False, True]
    together = vocoder.runner(windows, last)
    for w, is_last, got in zip(windows, last, together):
        alone = vocoder.runner([w], [is_last])[0]
        assert got.shape == (w.shape[1] * vocoder.hop_size,)
        torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        plain = vocoder.generator(windows[3][None])[0, 0, : 16 * vocoder.hop_size]
    torch.testing.assert_close(together[3], plain, rtol=1e-5, atol=1e-6)


def test_the_gpu_layout_gives_the_same_samples(monkeypatch):
    """The runner as it runs on CUDA (fused activations, channels-last convolutions), here on the CPU in float32:
    the same samples as the eager generator, padded windows and exact last windows alike. The fused activation
    takes its torch path (the kernel itself, channels-last included, is checked in test_vocoder_activation.py;
    in Triton's interpreter a whole generator takes minutes)."""
    import copy

    from services.vocoder import activation
    from services.vocoder.channels_last import ChannelsLastConv1d
    from services.vocoder.runner import GeneratorRunner

    monkeypatch.setattr(activation, "_INTERPRETED", False)
    h = config("moss-speech", 64)
    eager = gen.build_generator(h, seed=1)
    fast = GeneratorRunner(copy.deepcopy(eager), 480, torch.device("cpu"), fuse=True, channels_last=True)
    assert fast.fused == 109 and isinstance(fast.generator.conv_pre, ChannelsLastConv1d)
    plain = GeneratorRunner(eager, 480, torch.device("cpu"))
    g = torch.Generator().manual_seed(5)
    windows = [torch.randn(80, n, generator=g) - 5 for n in (2, 12, 40)]
    last = [False, False, True]
    for got, want in zip(fast(windows, last), plain(windows, last)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_last_windows_of_the_captured_exact_length_replay_a_graph():
    """A stream's last window usually has left_context + lookahead frames: it replays a graph captured for
    that exact length (no eager call) with the eager samples; other last windows still run eagerly."""
    from services.vocoder.runner import GeneratorRunner

    h = config("moss-speech", 64)
    graphs = GeneratorRunner(gen.build_generator(h, seed=1), 480, torch.device("cuda"))
    graphs.warm_up((1, 2, 3), exact_frames=(34,))
    eager = GeneratorRunner(gen.build_generator(h, seed=1), 480, torch.device("cuda"), graphs=False)
    g = torch.Generator().manual_seed(6)
    windows = [torch.randn(80, 34, generator=g) - 5 for _ in range(3)]
    def no_eager(*args):
        raise AssertionError("an eager call: only graph replays may run")

    graphs.generator.forward = no_eager
    got = graphs(windows, [True] * 3)
    del graphs.generator.forward
    for a, b in zip(got, eager(windows, [True] * 3)):
        torch.testing.assert_close(a, b, rtol=0.0, atol=2e-2)  # bf16; a graph's kernels may differ from eager ones
    other = torch.randn(80, 21, generator=g) - 5
    torch.testing.assert_close(graphs([other], [True])[0], eager([other], [True])[0], rtol=0.0, atol=2e-2)


def test_a_serving_runner_runs_shapes_it_has_no_graph_for_eagerly_and_unpadded(caplog):
    """The choice itself, on the CPU: a runner told it has graphs, serving, with none captured, must not capture (on
    a CPU that would fail) but run eagerly, unpadded: the samples of a runner without graphs; logged once a shape."""
    from services.vocoder.runner import GeneratorRunner, smallest

    generator = gen.build_generator(config("moss-speech", 64), seed=1)
    serving = GeneratorRunner(generator, 480, torch.device("cpu"), graphs=True)
    plain = GeneratorRunner(generator, 480, torch.device("cpu"), graphs=False)
    serving.serving = True
    g = torch.Generator().manual_seed(7)
    mels = [torch.randn(80, 20, generator=g) - 5 for _ in range(3)]
    with caplog.at_level("WARNING", logger="services.vocoder.runner"):
        for _ in range(2):
            for a, b in zip(serving(mels), plain(mels)):
                assert torch.equal(a, b)
    bucket = smallest(serving.batch_buckets, 3)
    assert not serving.graphs and caplog.text.count(f"generator calls of {bucket} windows of 24 frames run eagerly") == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_a_shape_the_warm_up_missed_runs_eagerly_once_serving_and_is_logged_once(caplog):
    """Once serving, a shape the warm-up did not capture is not captured (the other worker's calls would fail beside
    the capture: flow_graphs.py): it runs eagerly, gives the graph's samples, and the log names it once."""
    from services.vocoder.runner import GeneratorRunner

    runner = GeneratorRunner(gen.build_generator(config("moss-speech", 64), seed=1), 480, torch.device("cuda"))
    runner.warm_up((1,))
    g = torch.Generator().manual_seed(7)
    mels = [torch.randn(80, 20, generator=g) - 5 for _ in range(2)]
    with caplog.at_level("WARNING", logger="services.vocoder.runner"):
        runner.serving = True  # what the server's TokenVocoder.serve does after the warm-up
        runner(mels[:1])  # batch 1, 24 frames: warmed
        assert "eagerly" not in caplog.text
        captured = set(runner.graphs)
        eager = runner(mels)  # batch 2: not warmed
        runner(mels)
    assert set(runner.graphs) == captured  # nothing captured while serving
    assert caplog.text.count("generator calls of 2 windows of 24 frames run eagerly") == 1
    fresh = GeneratorRunner(gen.build_generator(config("moss-speech", 64), seed=1), 480, torch.device("cuda"))
    fresh.warm_up((1, 2))  # the same shape captured before serving
    for a, b in zip(eager, fresh(mels)):
        assert snr_db(b.numpy(), a.numpy()) > 30


@pytest.mark.parametrize("schedule", [[3, 3, 6, 12, 20, 1], [1] * 12, [40]], ids=["default", "1-token", "whole"])
def test_window_frames_foretells_the_window_prepare_returns(vocoder, schedule):
    """The worker weighs a chunk by window_frames before decoding it: the same frames prepare() then returns."""
    s = MelStreamer(vocoder)
    ids = tokens_for(vocoder, sum(schedule))
    at = 0
    for n in [*schedule, None]:
        expected = s.window_frames(n)
        window = s.prepare(None if n is None else ids[at : at + n])
        assert expected == (0 if window.mel is None else window.mel.shape[1])
        s.commit(window, None if window.mel is None else vocoder.vocode([window.mel], [window.last])[0])
        at += n or 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: two CUDA streams")
@pytest.mark.parametrize("preset", ["tiny", "tiny-codec"])
def test_a_streams_frames_made_on_the_lane_stay_whole_while_the_playing_stream_still_reads_them(preset):
    """A stream's first chunk on the first-chunk lane's CUDA stream, its next on the playing worker's, queued behind a
    long kernel there: the lane's next allocations must not get (and write over) the memory of the mel frames the
    playing stream's queued work is still to read (streamer.used_here). The race is bench/studies/lane_hazard.py's trial,
    which also shows it going wrong with used_here patched out."""
    import importlib.util
    import sys

    from services.vocoder.loader import load_vocoder

    studies = Path(__file__).resolve().parents[1] / "bench" / "studies"
    sys.path.insert(0, str(studies))  # (its bench_path)
    spec = importlib.util.spec_from_file_location("lane_hazard", studies / "lane_hazard.py")
    hazard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hazard)
    vocoder = load_vocoder(None, preset, "cuda")
    lane = torch.cuda.Stream()
    hazard.trial(vocoder, lane, 0)  # the calls' graphs captured first: a capture waits for the device, closing the race
    assert not any(hazard.trial(vocoder, lane, seed) for seed in range(1, 4)), \
        "the lane wrote over frames the playing stream read later"
