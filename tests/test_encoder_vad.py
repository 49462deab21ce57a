"""Voice activity for many speakers at once (vad.py) and the speech gate's rule (speech_gate.py)."""

from __future__ import annotations

import numpy as np
import pytest
import soxr
import torch

from services.encoder.speech_gate import SpeechGate
from services.encoder.vad import WINDOW, VadStream, VadWorker, load_network, speech_probabilities
from tests.speech import spoken


@pytest.fixture(scope="module")
def network():
    return load_network()


@pytest.fixture(scope="module")
def speech16k():
    samples, rate = spoken("Hello, what is the weather like in Paris today?", 1.0, 1.0)
    return soxr.resample(samples, rate, 16000).astype(np.float32)


def test_loading_keeps_torchs_thread_count():
    outer = torch.get_num_threads()
    torch.set_num_threads(2)  # not the suite's 1 (conftest.py), which is what the package sets when imported
    try:
        load_network()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(outer)


def test_batched_speakers_each_get_the_packages_own_probabilities(network, speech16k):
    """Three speakers fed in different chunkings, together: each speaker's probabilities are those of the package's
    wrapper (state kept inside the model) fed that speaker's windows alone."""
    from silero_vad import load_silero_vad

    audios = [speech16k, speech16k[4000:] * 0.5, np.random.default_rng(0).normal(0, 0.05, 40000).astype(np.float32)]
    chunks = [1000, 3333, 512]
    streams = [VadStream() for _ in audios]
    got = [[] for _ in audios]
    position = [0, 0, 0]
    while any(p < len(a) for p, a in zip(position, audios)):
        items = []
        for i, (audio, size) in enumerate(zip(audios, chunks)):
            if position[i] < len(audio):
                items.append((i, audio[position[i] : position[i] + size]))
                position[i] += size
        for (i, _), probs in zip(items, speech_probabilities(network, [(streams[i], c) for i, c in items])):
            got[i] += probs
    wrapper = load_silero_vad()
    for audio, probs in zip(audios, got):
        wrapper.reset_states()
        expected = [float(wrapper(torch.from_numpy(audio[k : k + WINDOW].copy()), 16000))
                    for k in range(0, len(audio) // WINDOW * WINDOW, WINDOW)]
        assert len(probs) == len(expected)
        np.testing.assert_allclose(probs, expected, atol=1e-5)


def test_the_worker_answers_every_speaker(network, speech16k):
    worker = VadWorker(network)
    try:
        streams = [VadStream() for _ in range(5)]
        futures = [worker.probabilities(s, speech16k[:16000]) for s in streams]
        results = [f.result(timeout=30) for f in futures]
        assert all(len(r) == 16000 // WINDOW for r in results)
        for r in results[1:]:  # the same audio, the same answer (to rounding: batched in different groups)
            np.testing.assert_allclose(r, results[0], atol=1e-5)
    finally:
        worker.stop()


def feed(gate: SpeechGate, audio: np.ndarray, probabilities: list[float], chunk: int = 700):
    """The audio in chunks, each with the probabilities of the windows it completes → (speech, started, ended)."""
    speech, started, ended, judged = [], None, None, 0
    for start in range(0, len(audio), chunk):
        piece = audio[start : start + chunk]
        whole = (start + len(piece)) // WINDOW
        out = gate.advance(piece, probabilities[judged:whole])
        judged = whole
        speech.append(out.speech)
        started = out.started if out.started is not None else started
        ended = out.ended if out.ended is not None else ended
    return np.concatenate(speech), started, ended


def test_the_gate_keeps_speech_with_its_pads_and_ends_after_the_silence():
    audio = np.arange(40 * WINDOW, dtype=np.float32)  # each sample its own index
    p = [0.1] * 10 + [0.9] * 8 + [0.45] * 2 + [0.9] * 3 + [0.1] * 17   # speech 10-22, a lull that is not silence
    gate = SpeechGate(threshold=0.5, end_silence=8 * WINDOW / 16000, pad=100 / 16000)
    speech, started, ended = feed(gate, audio, p)
    assert started == 10 * WINDOW - 100
    assert ended == 23 * WINDOW + 100            # the silence starts at window 23; its first 100 samples kept
    np.testing.assert_array_equal(speech, audio[started:ended])


def test_a_silence_shorter_than_the_end_is_speech():
    audio = np.arange(40 * WINDOW, dtype=np.float32)
    p = [0.9] * 5 + [0.1] * 4 + [0.9] * 5 + [0.1] * 26
    gate = SpeechGate(end_silence=6 * WINDOW / 16000, pad=0)
    speech, started, ended = feed(gate, audio, p)
    assert (started, ended) == (0, 14 * WINDOW)
    np.testing.assert_array_equal(speech, audio[:ended])  # the pause included


def test_a_turn_ended_by_its_client_keeps_speech_to_the_end_or_to_its_silence():
    audio = np.arange(20 * WINDOW + 100, dtype=np.float32)
    for p, end in (([0.1] * 5 + [0.9] * 15, len(audio)), ([0.1] * 5 + [0.9] * 5 + [0.1] * 10, 10 * WINDOW + 64)):
        gate = SpeechGate(end_silence=1.0, pad=64 / 16000)
        speech, started, ended = feed(gate, audio, p)
        assert ended is None and started == 5 * WINDOW - 64
        speech = np.concatenate([speech, gate.finish().speech])
        np.testing.assert_array_equal(speech, audio[started:end])
    silent = SpeechGate()
    assert feed(silent, audio, [0.1] * 20)[0].size == 0 and silent.finish().speech.size == 0


def test_speech_longer_than_the_most_ends_there():
    audio = np.zeros(40 * WINDOW, np.float32)
    gate = SpeechGate(pad=0, max_speech=10 * WINDOW / 16000)
    speech, started, ended = feed(gate, audio, [0.9] * 40)
    assert (started, ended) == (0, 10 * WINDOW) and len(speech) == 10 * WINDOW


def test_spoken_words_are_found_in_silence(network, speech16k):
    """espeak-ng's sentence after 1 s of silence and before 1 s more: the gate finds it there."""
    gate, stream = SpeechGate(end_silence=0.5, pad=0.1), VadStream()
    started = ended = None
    for start in range(0, len(speech16k), 1600):
        piece = speech16k[start : start + 1600]
        out = gate.advance(piece, speech_probabilities(network, [(stream, piece)])[0])
        started = out.started if out.started is not None else started
        ended = out.ended if out.ended is not None else ended
    voiced = np.flatnonzero(np.abs(speech16k) > 0.01)
    assert started is not None and ended is not None
    assert voiced[0] - 0.25 * 16000 <= started <= voiced[0]
    assert voiced[-1] - 0.2 * 16000 <= ended <= voiced[-1] + 0.25 * 16000
