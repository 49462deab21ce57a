"""The codec decoder streamed: the flow in blocks and HiFT in windows against decoding the whole stream at once,
streams batched against each alone, and voices (tiny-codec preset: the real layout, small, random weights)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from services.common.errors import InvalidArgument
from services.vocoder import generator as gen
from services.vocoder.codec.config import moss_speech, tiny
from services.vocoder.codec.decoder import FlowTokenDecoder
from services.vocoder.codec.flow_state import FlowState
from services.vocoder.codec.hift import HiFTGenerator, receptive_field
from services.vocoder.codec.voice import VoiceError, load_voices, random_voice, save_voice
from services.vocoder.loader import FlowOptions, load_vocoder
from services.vocoder.streamer import MelStreamer
from services.vocoder.vocoder import MelFormatMismatch, TokenVocoder
from services.vocoder.worker import Job, VocoderWorker

# The gateway's default chunk schedule (common.proto ChunkPolicy: 8, 5, 10, 20, ...), its earlier one, a smaller first
# chunk, one token at a time, and whole blocks.
SCHEDULES = {"gateway": [8, 5, 10] + [20] * 10, "8-8-16": [8, 8, 16] + [20] * 10, "small first": [4, 4, 8, 16] + [20] * 10,
             "one-token": [1] * 120, "blocks": [5] * 24}


def snr(streamed: np.ndarray, offline: np.ndarray) -> float:
    return float(10 * np.log10((offline ** 2).sum() / max(((streamed - offline) ** 2).sum(), 1e-30)))


def codes(n: int, seed: int = 0, codebook: int = 1024) -> list[int]:
    return np.random.default_rng(seed).integers(0, codebook, n).tolist()


@pytest.fixture(scope="module")
def whole_context():
    """Every token in every window, every frame in the stream history: the flow's streamed blocks are then its
    offline decode."""
    return load_vocoder(None, "tiny-codec", flow=FlowOptions(max_context_tokens=1000, history_streams=4,
                                                             history_frames=1000))


@pytest.fixture(scope="module")
def vocoder():
    return load_vocoder(None, "tiny-codec")


def stream_mel(v: TokenVocoder, tokens: list[int], schedule: list[int]) -> torch.Tensor:
    state, pieces, at = v.start(), [], 0
    for n in schedule:
        if at >= len(tokens):
            break
        mel, state = v.mel_chunks([(tokens[at : at + n], state)])[0]
        pieces.append(mel)
        at += n
    pieces.append(v.mel_chunks([(None, state)])[0][0])
    return torch.cat(pieces, dim=1)


def stream_wav(v: TokenVocoder, tokens: list[int], schedule: list[int], **context) -> np.ndarray:
    s, pieces, at = MelStreamer(v, **context), [], 0
    for n in schedule:
        if at >= len(tokens):
            break
        pieces.append(s.push(tokens[at : at + n]))
        at += n
    return np.concatenate([*pieces, s.flush()])


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_flow_blocks_are_the_offline_decode(whole_context, schedule):
    tokens = codes(47)
    offline = whole_context.mel(tokens)
    streamed = stream_mel(whole_context, tokens, SCHEDULES[schedule])
    assert streamed.shape == offline.shape == (80, 47 * 4)
    torch.testing.assert_close(streamed, offline, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("history", [True, False])
def test_flow_with_a_bounded_context_stays_close(vocoder, history):
    """The defaults: a block reads a stream's latest 40 frames kept in its history (codec/history.py), and the
    encoder the latest 40 tokens; or, without a history, the flow solves the latest 40 tokens again. Either is close
    to the offline decode, not equal (docs/codec.md reports the figures at every schedule)."""
    v = vocoder if history else load_vocoder(None, "tiny-codec", flow=FlowOptions(history_streams=0))
    tokens = codes(90)
    offline = v.mel(tokens)
    exact = 40 if history else 80   # frames equal to offline: the ring holds the prompt's last frames and 1 block
    for schedule in SCHEDULES.values():
        streamed = stream_mel(v, tokens, schedule)
        torch.testing.assert_close(streamed[:, :exact], offline[:, :exact], atol=1e-4, rtol=1e-4)
        assert 35 < snr(streamed.numpy(), offline.numpy()) < 200


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_hift_windows_with_the_receptive_field_are_offline_synthesis(whole_context, schedule):
    tokens = codes(41, seed=1)
    offline = whole_context.waveform(whole_context.mel(tokens))
    left, right = whole_context.receptive_field
    streamed = stream_wav(whole_context, tokens, SCHEDULES[schedule], left_context=left, lookahead=right)
    assert len(streamed) == len(offline) == 41 * 1920
    assert snr(streamed, offline) > 65  # float32 phase arithmetic: the source's phase is 2π·480·Σ cycles
    assert np.abs(offline).max() > 1e-3


def test_default_lookahead_is_close_to_offline(whole_context):
    tokens = codes(41, seed=2)
    offline = whole_context.waveform(whole_context.mel(tokens))
    for schedule in SCHEDULES.values():
        assert snr(stream_wav(whole_context, tokens, schedule), offline) > 40


def test_batched_streams_are_each_alone(vocoder):
    """Streams of different lengths and chunkings through one worker, together: each as it is alone."""
    inputs = [(codes(n, seed=n), schedule) for n, schedule in ((23, [4, 4, 8, 16]), (37, [1] * 37), (12, [12]))]
    alone = [stream_wav(vocoder, tokens, schedule) for tokens, schedule in inputs]
    worker = VocoderWorker(vocoder, max_wait=0.05)
    try:
        streams = [MelStreamer(vocoder) for _ in inputs]
        outs: list[list[np.ndarray]] = [[] for _ in inputs]
        rounds = max(len(schedule) for _, schedule in inputs)
        at = [0] * len(inputs)
        for r in range(rounds + 1):
            futures = []
            for i, ((tokens, schedule), s) in enumerate(zip(inputs, streams)):
                if r < len(schedule):
                    futures.append((i, worker.submit(Job(s, tokens[at[i] : at[i] + schedule[r]], None, 0.0))))
                    at[i] += schedule[r]
                elif r == len(schedule):
                    futures.append((i, worker.submit(Job(s, None, None, 0.0))))
            for i, future in futures:
                outs[i].append(future.result(timeout=60).samples)
    finally:
        worker.stop()
    for got, want in zip(outs, alone):
        np.testing.assert_allclose(np.concatenate(got), want, atol=1e-5)


def test_receptive_field_is_what_the_gradient_sees():
    """HiFT's network reach (the F0 predictor's 5 frames added on top) through the real-size generator."""
    model = HiFTGenerator(moss_speech().hift).double()
    frames, probe = 61, 30
    mel = (torch.randn(1, 80, frames, dtype=torch.float64) - 5).requires_grad_(True)
    f0 = torch.full((1, frames), 200.0, dtype=torch.float64)
    wav = model.synthesize(mel, f0, torch.zeros(1, 9, dtype=torch.float64),
                           torch.zeros(1, frames * 480, 9, dtype=torch.float64))
    wav[0, 0, probe * 480 : (probe + 1) * 480].sum().backward()
    reached = (mel.grad[0].abs().sum(0) > 0).nonzero().flatten()
    left, right = receptive_field(moss_speech().hift)
    assert (probe - int(reached.min()) + 5, int(reached.max()) - probe + 5) == (left, right) == (19, 19)


def test_hift_istft_is_torch_istft():
    """HiFT's iSTFT, written out so that a CUDA graph can capture it, is torch.istft's (centred, Hann window)."""
    model = HiFTGenerator(moss_speech().hift)
    for frames in (2, 5, 61):
        spec = torch.randn(3, model.n_fft // 2 + 1, frames, dtype=torch.complex64)
        want = torch.istft(spec, model.n_fft, model.istft_hop, model.n_fft, window=model.window)
        got = model.istft(spec)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_voices_load_and_bad_ones_are_refused_by_name(tmp_path):
    cfg = tiny().flow
    save_voice(random_voice(cfg, "alto", prompt_tokens=6, seed=1), tmp_path)
    save_voice(random_voice(cfg, "default", prompt_tokens=8, seed=2), tmp_path)
    voices = load_voices(tmp_path, cfg)
    assert sorted(voices) == ["alto", "default"] and voices["alto"].prompt_frames == 24
    v = load_vocoder(None, "tiny-codec", voices_dir=tmp_path)
    assert v.voice_names() == ["alto", "default"]
    with pytest.raises(InvalidArgument, match="unknown voice 'tenor'; known voices: alto, default"):
        MelStreamer(v, voice="tenor")
    # Each voice speaks in its own way: its prompt and x-vector condition the flow.
    tokens = codes(20, seed=5)
    assert not torch.allclose(v.mel(tokens, "alto"), v.mel(tokens, "default"))

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "corrupt.safetensors").write_bytes(b"\x00not safetensors")
    with pytest.raises(VoiceError, match="corrupt.safetensors: not a readable safetensors file"):
        load_voices(bad, cfg)
    (bad / "corrupt.safetensors").unlink()
    voice = random_voice(cfg, "short", prompt_tokens=6)
    save_voice(type(voice)("short", voice.prompt_tokens, voice.prompt_mel[:10], voice.embedding), bad)
    with pytest.raises(VoiceError, match=r"short.safetensors: prompt_mel must be \[4 x 6 prompt tokens, 80\], got \(10, 80\)"):
        load_voices(bad, cfg)
    (bad / "short.safetensors").unlink()
    with pytest.raises(VoiceError, match="no voices"):
        load_voices(bad, cfg)
    with pytest.raises(VoiceError, match="no such voices directory"):
        load_voices(tmp_path / "missing", cfg)


def test_flow_and_a_generator_of_another_mel_format_are_refused():
    flow_decoder = load_vocoder(None, "tiny-codec").decoder
    h = gen.preset_config("bigvgan-v2-22khz-80band-256x")
    with pytest.raises(MelFormatMismatch, match="24000 Hz, 80 bands, hop 480 but the BigVGAN generator expects "
                                                "22050 Hz, 80 bands, hop 256"):
        TokenVocoder(flow_decoder, gen.build_generator(h), torch.device("cpu"),
                     {"default": random_voice(tiny().flow)})


def test_flow_block_settings_are_checked():
    flow = load_vocoder(None, "tiny-codec").decoder.flow
    with pytest.raises(ValueError, match="must hold a block and its look-ahead"):
        FlowTokenDecoder(flow, torch.device("cpu"), block_tokens=5, max_context_tokens=7)
    with pytest.raises(ValueError, match="block_tokens must be >= 1"):
        FlowTokenDecoder(flow, torch.device("cpu"), block_tokens=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs of the flow: needs a GPU")
def test_flow_graphs_on_cuda_are_the_eager_flow_and_rows_stay_apart():
    """bf16 on CUDA: a (batch, token bucket) graph gives the eager call's frames, and a row's frames batched with
    others are its frames alone (to bf16 rounding: another batch size may take other kernels)."""
    cpu = load_vocoder(None, "tiny-codec")
    voice = cpu.voices["default"]
    device = torch.device("cuda")
    graphs = FlowTokenDecoder(cpu.decoder.flow, device)
    eager = FlowTokenDecoder(load_vocoder(None, "tiny-codec").decoder.flow, device, graphs=False)
    streams = [FlowState(voice, tuple(codes(n, seed=n)), 0, 0) for n in (8, 13, 21)]
    together = graphs.decode_chunks([([], s) for s in streams])
    assert graphs.graphs, "no graph was captured"
    for s, (mel, _) in zip(streams, together):
        alone = graphs.decode_chunks([([], s)])[0][0]
        reference = eager.decode_chunks([([], s)])[0][0]
        assert mel.shape == alone.shape == reference.shape and mel.shape[1] > 0
        assert snr(mel.cpu().numpy(), reference.cpu().numpy()) > 30
        assert snr(mel.cpu().numpy(), alone.cpu().numpy()) > 30


def test_serve_marks_each_workers_graphs_apart():
    """TokenVocoder.serve (the server, after the warm-up) turns a worker's flow and generator graphs to serving: from
    then on a shape they lack runs eagerly. A lane's graphs are its own, marked by its own serve."""
    v = load_vocoder(None, "tiny-codec")
    lane = v.lane()
    v.serve()
    assert v.runner.serving and v.decoder.graphs.serving
    assert not lane.runner.serving and not lane.decoder.graphs.serving
    lane.serve()
    assert lane.runner.serving and lane.decoder.graphs.serving


def serving_and_eager(history: int) -> tuple[FlowTokenDecoder, FlowTokenDecoder, object]:
    """Two CPU decoders of one tiny flow and voice (history: its stream slots): one to be told it has graphs and
    serves, one without graphs (the frames to compare with) → (serving, eager, voice)."""
    flow = load_vocoder(None, "tiny-codec").decoder.flow
    voice = load_vocoder(None, "tiny-codec").voices["default"]
    cpu = torch.device("cpu")
    serving = FlowTokenDecoder(flow, cpu, history_streams=history)
    eager = FlowTokenDecoder(flow, cpu, history_streams=history, graphs=False)
    for d in (serving, eager):
        d.set_voices([voice])
    return serving, eager, voice


@pytest.mark.parametrize("history", [0, 4], ids=["windows", "history"])
def test_a_serving_decoder_runs_shapes_it_has_no_graph_for_eagerly_and_unpadded(caplog, history):
    """The choice itself, on the CPU: a decoder told it has graphs, serving, with none captured, must not capture (on a
    CPU that would fail) but decode eagerly, unpadded: the frames of a decoder without graphs; logged once a shape."""
    serving, eager, voice = serving_and_eager(history)
    serving.use_graphs, serving.graphs.serving = True, True
    streams = [tuple(codes(n, seed=n)) for n in (8, 13, 21)]
    with caplog.at_level("WARNING", logger="services.vocoder.codec.flow_graphs"):
        for _ in range(2):
            got, want = ([d.decode_chunks([(list(c), d.start(voice)) for c in streams])
                          for d in (serving, eager)])
            for (a, _), (b, _) in zip(got, want):
                assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)
            for d, out in ((serving, got), (eager, want)):
                for _, state in out:
                    d.release(state)
    assert not serving.graphs.graphs and "run eagerly" in caplog.text
    logged = [r for r in caplog.records if r.name == "services.vocoder.codec.flow_graphs"]
    assert len(logged) == len(serving.graphs.eager_shapes)  # once a shape


class StandInGraph:
    """A captured graph's stand-in on the CPU: replay() runs the flow over the static inputs into the static output,
    as a replay of a CUDA graph captured over them would."""

    def __init__(self, run, out: torch.Tensor):
        self.run, self.out, self.replays = run, out, 0

    def replay(self) -> None:
        self.out.copy_(self.run())
        self.replays += 1


def stand_in_cover(d: FlowTokenDecoder, voices) -> tuple:
    """The decoder's cover (its plan's largest shape: capture.py), 'captured' as a StandInGraph → its key."""
    (cover,) = [s for s in d.shapes(voices, max_batch=8) if s.cover]
    B, T, reads, N = cover.key[1]
    prefix = d.history if N is not None else d.prefix if reads else None
    scratch = d.history.scratch if N is not None else None
    static = d.graphs.empty(B, T, N, scratch, kept_encoder=getattr(prefix, "encoder", None) is not None)

    def run():
        return d.graphs.flow(static, streaming=True, prefix=prefix)

    out = run().clone()
    d.graphs.graphs[cover.key[1]] = (StandInGraph(run, out), static, out)
    return cover.key[1]


@pytest.mark.parametrize("history", [0, 4], ids=["windows", "history"])
def test_a_serving_decoder_pads_a_call_it_has_no_graph_for_into_its_cover(history):
    """Serving, a call whose shape is not captured replays the cover (the plan's largest graph, captured before
    serving) padded to its rows, tokens and frames: the frames of a decoder without graphs, nothing run eagerly, and
    its own shape asked for as covered (captured when the vocoder is idle: capture.py)."""
    serving, eager, voice = serving_and_eager(history)
    serving.use_graphs = True
    key = stand_in_cover(serving, [voice])
    asked = []
    serving.graphs.serving = True
    serving.graphs.on_missing = lambda shape, covered: asked.append((shape, covered)) or True
    streams = [tuple(codes(n, seed=n)) for n in (8, 13, 21)]
    for _ in range(2):
        got, want = ([d.decode_chunks([(list(c), d.start(voice)) for c in streams]) for d in (serving, eager)])
        for (a, _), (b, _) in zip(got, want):
            assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)
        for d, out in ((serving, got), (eager, want)):
            for _, state in out:
                d.release(state)
    assert serving.graphs.graphs[key][0].replays == 2 and not serving.graphs.eager_shapes
    assert asked and all(covered and shape != key for shape, covered in asked)
    assert all(shape[0] < key[0] for shape, _ in asked)  # three rows' bucket, under the cover's


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs of the flow: needs a GPU")
def test_flow_calls_of_a_shape_not_captured_run_eagerly_once_serving(caplog):
    """Once serving (TokenVocoder.serve), a call shape the warm-up missed is not captured beside the other worker's
    calls: it runs eagerly, gives the eager decoder's frames, and is logged once (flow_graphs.py)."""
    cpu = load_vocoder(None, "tiny-codec")
    voice = cpu.voices["default"]
    device = torch.device("cuda")
    graphs = FlowTokenDecoder(cpu.decoder.flow, device)
    eager = FlowTokenDecoder(load_vocoder(None, "tiny-codec").decoder.flow, device, graphs=False)
    one = [FlowState(voice, tuple(codes(13, seed=1)), 0, 0)]
    three = [FlowState(voice, tuple(codes(n, seed=n)), 0, 0) for n in (8, 13, 21)]
    graphs.decode_chunks([([], s) for s in one])  # captured at its first use: not serving yet
    captured = set(graphs.graphs)
    assert captured
    graphs.graphs.serving = True
    with caplog.at_level("WARNING", logger="services.vocoder.codec.flow_graphs"):
        together = graphs.decode_chunks([([], s) for s in three])  # another batch bucket
        graphs.decode_chunks([([], s) for s in three])
    assert set(graphs.graphs) == captured
    assert caplog.text.count("run eagerly") == 1
    for s, (mel, _) in zip(three, together):
        reference = eager.decode_chunks([([], s)])[0][0]
        assert mel.shape == reference.shape and snr(mel.cpu().numpy(), reference.cpu().numpy()) > 30


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the real-size codec on a GPU")
def test_real_size_codec_streams_on_cuda():
    v = load_vocoder(None, "moss-speech", "cuda")
    tokens = codes(30, codebook=16384)
    streamed = stream_wav(v, tokens, SCHEDULES["gateway"])
    assert len(streamed) == 30 * 1920 and np.isfinite(streamed).all() and np.abs(streamed).max() > 0


@pytest.mark.parametrize("schedule", ["gateway", "one-token", "blocks"])
def test_a_stream_ends_with_a_window_of_a_length_the_vocoder_captures(vocoder, schedule):
    """The last window of a stream past its first blocks is its left context, the held-back look-ahead and what the
    flow still held at the end: one of the lengths the server captures graphs for (TokenVocoder.end_frames)."""
    assert vocoder.end_frames == (0, 4, 8, 12, 16, 20, 24, 28)   # up to a block and its look-ahead, less a token
    left, lookahead = vocoder.receptive_field[0], 4
    captured = {left + lookahead + frames for frames in vocoder.end_frames}
    seen = set()
    for n in range(24, 44, 3):
        s, at = MelStreamer(vocoder, lookahead=lookahead), 0
        for size in SCHEDULES[schedule]:
            if at >= n:
                break
            window = s.prepare(codes(n)[at : at + size])
            if window.mel is not None:  # (the samples' values do not matter here: zeros, the phase kept)
                s.commit(window, (np.zeros(window.mel.shape[1] * 480, np.float32), [window.conditions[0]]))
            at += size
        last = s.prepare(None)
        assert last.last and last.mel.shape[1] in captured, (n, last.mel.shape[1])
        seen.add(last.mel.shape[1])
    assert len(seen) > 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_hift_windows_wait_for_nothing_and_last_windows_replay_graphs():
    """HiFT at the real size on CUDA, as the vocoder runs it: a call's inputs from the host never make the host wait
    for the device (a pageable copy would: checked by the same debug mode); last windows of the captured exact lengths
    replay graphs, more of them than a graph takes in several replays, with the eager samples and phases."""
    from services.vocoder.runner import GeneratorRunner

    hift = HiFTGenerator(moss_speech().hift).eval()
    conds = dict(cond_dtypes=(torch.float32, torch.long, torch.long, torch.long), cond_shapes=((9,), (), (), ()))
    cuda = torch.device("cuda")
    graphs = GeneratorRunner(hift, 480, cuda, fuse=False, channels_last=False, **conds)
    graphs.warm_up((1, 2, 3, 4), exact_frames=(27, 43), exact_batches=(1, 2))
    eager = GeneratorRunner(copy.deepcopy(hift), 480, cuda, fuse=False, channels_last=False, graphs=False, **conds)
    g = torch.Generator().manual_seed(7)
    mels = [torch.randn(80, n, generator=g).to(cuda) - 5 for n in (60, 43, 43, 43, 43, 43)]
    where = [(torch.rand(9, generator=g), torch.tensor(19), torch.tensor(n - (0 if i else 4)), torch.tensor(48000 * i))
             for i, n in enumerate(m.shape[1] for m in mels)]
    last = [False] + [True] * 5
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            torch.zeros(3).to(cuda)                               # what the mode catches
        with torch.inference_mode():
            graphs._run(mels[:1], 64, True, where[:1])          # a window's call, up to its samples: no wait
    finally:
        torch.cuda.set_sync_debug_mode(0)
    replays = []
    for graph, *_ in graphs.graphs.values():
        graph.replay = (lambda g: lambda: (replays.append(1), type(g).replay(g)))(graph)

    def no_eager(*args):
        raise AssertionError("an eager call: only graph replays may run")

    graphs.generator.forward = no_eager
    got = graphs(mels, last, where)
    del graphs.generator.forward
    assert len(replays) == 1 + 3                                  # the first window's bucket; 5 last windows, 2 a replay
    for (wav, (phase,)), (want, (want_phase,)) in zip(got, eager(mels, last, where)):
        assert phase.device.type == "cpu"                         # back with the samples
        torch.testing.assert_close(wav, want, rtol=0.0, atol=2e-2)  # bf16; a graph's kernels may differ from eager ones
        turn = (phase - want_phase).abs()
        assert float(torch.minimum(turn, 1 - turn).max()) < 2e-2   # cycles mod 1
