"""The vocoder stage: token decoder + BigVGAN-v2 from the `bigvgan` package, streamed chunk by chunk."""

import numpy as np
import pytest
import torch

from services.vocoder import generator as gen
from services.vocoder.loader import load_vocoder
from services.vocoder.streamer import MelStreamer
from services.vocoder.token_decoder import (
    TokenDecoderConfig,
    load_token_decoder,
    random_token_decoder,
    save_token_decoder,
)
from services.vocoder.vocoder import MelFormatMismatch, TokenVocoder


@pytest.fixture(scope="module")
def vocoder():
    return load_vocoder(None, "tiny")


def test_default_config_maps_four_frames_per_token():
    h = gen.preset_config("moss-speech")
    fmt = gen.mel_format(h)
    assert (fmt.sampling_rate, fmt.num_mels, fmt.hop_size) == (24000, 80, 480)
    assert TokenDecoderConfig().samples_per_token == 1920  # 80 ms at 24 kHz


def test_streamed_audio_has_exact_length_and_tracks_offline(vocoder):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocoder.codebook_size, 37).tolist()
    offline = vocoder.waveform(vocoder.mel(tokens))
    streamer = MelStreamer(vocoder, left_context=16, lookahead=4)
    pieces = [streamer.push(tokens[i : i + 5]) for i in range(0, len(tokens), 5)] + [streamer.flush()]
    streamed = np.concatenate(pieces)
    assert len(streamed) == len(offline) == 37 * 1920
    assert sum(len(p) > 0 for p in pieces) >= 7          # audio flows before the end of the stream
    rel = np.linalg.norm(streamed - offline) / np.linalg.norm(offline)
    assert rel < 0.05, rel
    no_context = np.concatenate([vocoder.waveform(vocoder.mel(tokens[i : i + 5])) for i in range(0, len(tokens), 5)])
    assert rel < np.linalg.norm(no_context - offline) / np.linalg.norm(offline)  # context helps


def test_loads_a_bigvgan_directory_with_its_token_decoder(tmp_path, vocoder):
    h = gen.preset_config("tiny")
    import bigvgan

    torch.manual_seed(5)
    trained = bigvgan.BigVGAN(h)   # weight-normed, as checkpoints are saved
    gen.save_generator(trained, h, tmp_path)
    decoder = random_token_decoder(TokenDecoderConfig(codebook_size=1024, embed_dim=32), seed=2)
    save_token_decoder(decoder, tmp_path)
    loaded = load_vocoder(tmp_path)
    tokens = [1, 2, 3, 500, 1023]
    mel = decoder(torch.tensor(tokens))
    with torch.no_grad():
        trained.remove_weight_norm()
        want = trained.eval()(mel[None])[0, 0].numpy()
    np.testing.assert_allclose(loaded.waveform(loaded.mel(tokens)), want, rtol=1e-4, atol=1e-5)


def test_mismatched_mel_formats_are_refused():
    h = gen.preset_config("tiny")
    decoder = random_token_decoder(TokenDecoderConfig(codebook_size=1024, hop_size=256, embed_dim=16))
    with pytest.raises(MelFormatMismatch, match="hop 256.*hop 480"):
        TokenVocoder(decoder, gen.build_generator(h), torch.device("cpu"))
    decoder = random_token_decoder(TokenDecoderConfig(codebook_size=1024, num_mels=100, embed_dim=16))
    with pytest.raises(MelFormatMismatch, match="100 bands"):
        TokenVocoder(decoder, gen.build_generator(h), torch.device("cpu"))


def test_missing_checkpoint_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_vocoder(tmp_path)


@pytest.mark.parametrize("schedule", [[1] * 9, [2, 1, 4, 2], [9]], ids=["1-token", "irregular", "whole"])
def test_the_token_decoder_streams_causally_with_its_state(schedule):
    """Chunk by chunk with the stream's state = the whole stream at once; and the state matters: a token's
    frames change with the tokens before it (within context_tokens) and not with those further back."""
    decoder = random_token_decoder(TokenDecoderConfig(codebook_size=1024, embed_dim=32, context_tokens=2), seed=3)
    tokens = torch.tensor([5, 900, 17, 3, 3, 256, 1000, 0, 42])
    whole = decoder(tokens)
    pieces, state, i = [], None, 0
    for n in schedule:
        mel, state = decoder.decode(tokens[i : i + n], state)
        pieces.append(mel)
        i += n
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=1e-6, atol=1e-6)
    fpt = decoder.cfg.frames_per_token
    last = lambda seq: decoder(torch.tensor(seq))[:, -fpt:]  # noqa: E731  the last token's frames
    assert not torch.allclose(last([1, 2, 7]), last([1, 9, 7]))  # one token back: inside the context
    torch.testing.assert_close(last([1, 2, 3, 7]), last([8, 2, 3, 7]))  # three back: outside it


@pytest.mark.parametrize("context", [2, 0])
def test_the_token_decoder_decodes_many_streams_at_once_as_each_alone(context):
    """One pass over streams at different points (a start, mid-stream states, ragged chunk lengths) gives each
    stream the frames and the next state that decoding it alone gives."""
    decoder = random_token_decoder(TokenDecoderConfig(codebook_size=1024, embed_dim=32, context_tokens=context), seed=4)
    g = torch.Generator().manual_seed(0)
    history = [torch.randint(0, 1024, (n,), generator=g) for n in (0, 3, 1, 7)]
    states = [decoder.decode(h)[1] if len(h) else None for h in history]
    chunks = [torch.randint(0, 1024, (n,), generator=g) for n in (2, 5, 1, 3)]
    together = decoder.decode_batch(torch.cat(chunks), [len(c) for c in chunks], states)
    for chunk, state, (mel, next_state) in zip(chunks, states, together):
        want_mel, want_state = decoder.decode(chunk, state)
        torch.testing.assert_close(mel, want_mel, rtol=1e-5, atol=1e-5)
        if context:
            torch.testing.assert_close(next_state, want_state, rtol=0, atol=0)


def test_a_per_token_decoder_of_an_earlier_version_still_loads(tmp_path):
    import json

    decoder = random_token_decoder(TokenDecoderConfig(codebook_size=64, embed_dim=8, context_tokens=0))
    save_token_decoder(decoder, tmp_path)
    cfg = json.loads((tmp_path / "token_decoder.json").read_text())
    del cfg["context_tokens"]
    (tmp_path / "token_decoder.json").write_text(json.dumps(cfg))
    loaded = load_token_decoder(tmp_path)
    assert loaded.cfg.context_tokens == 0
    torch.testing.assert_close(loaded(torch.tensor([1, 2])), decoder(torch.tensor([1, 2])))
