"""The reference's codec decoder as a test oracle: CosyVoice2's flow, flow matching, upsampling encoder and HiFT
modules from the `cosyvoice2-eu` wheel (installed with --no-deps; Makefile), built from our CodecConfig. Also the
peer of bench/codec.py.

The wheel's `matcha.utils` package imports hydra and lightning (training only) and `cosyvoice.utils.class_utils`
imports its LLM and CLI; the modules used here need neither, so those two are replaced in sys.modules by the
few names the modules read from them. The wheel's encoder fixes its upsampling stride at 2 (CosyVoice2's
25 Hz tokens); MOSS-Speech's decoder takes a stride, so the oracle's up_layer is rebuilt with ours.
"""

from __future__ import annotations

import logging
import sys
import types

import pytest

from services.vocoder.codec.config import CodecConfig


class _AttrDict(dict):
    __getattr__ = dict.__getitem__


def _stub_modules() -> None:
    try:  # its DictConfig holds the flow-matching parameters; a dict with attribute access does the same
        import omegaconf  # noqa: F401
    except ImportError:
        sys.modules["omegaconf"] = types.SimpleNamespace(DictConfig=_AttrDict)
    if "matcha.utils.pylogger" not in sys.modules:
        utils = types.ModuleType("matcha.utils")
        utils.__path__ = []
        pylogger = types.ModuleType("matcha.utils.pylogger")
        pylogger.get_pylogger = lambda name=__name__: logging.getLogger(name)
        sys.modules["matcha.utils"], sys.modules["matcha.utils.pylogger"] = utils, pylogger
    if "cosyvoice.utils.class_utils" not in sys.modules:
        import torch
        from cosyvoice.transformer import activation, attention, embedding, subsampling

        classes = types.ModuleType("cosyvoice.utils.class_utils")
        classes.COSYVOICE_ACTIVATION_CLASSES = {"swish": activation.Swish, "relu": torch.nn.ReLU, "gelu": torch.nn.GELU}
        classes.COSYVOICE_SUBSAMPLE_CLASSES = {"linear": subsampling.LinearNoSubsampling}
        classes.COSYVOICE_EMB_CLASSES = {"rel_pos_espnet": embedding.EspnetRelPositionalEncoding}
        classes.COSYVOICE_ATTENTION_CLASSES = {"rel_selfattn": attention.RelPositionMultiHeadedAttention}
        sys.modules["cosyvoice.utils.class_utils"] = classes


def reference():
    """→ the reference's module namespace, or skip (saying why) where the wheel is not installed."""
    pytest.importorskip("cosyvoice", reason="the cosyvoice2-eu wheel (test oracle) is not installed: make install")
    _stub_modules()
    from cosyvoice.flow import decoder, flow, flow_matching
    from cosyvoice.hifigan import f0_predictor, generator
    from cosyvoice.transformer import upsample_encoder

    return types.SimpleNamespace(flow=flow, flow_matching=flow_matching, decoder=decoder, generator=generator,
                                 f0_predictor=f0_predictor, upsample_encoder=upsample_encoder)


def reference_flow(cfg: CodecConfig):
    ref, f = reference(), cfg.flow
    from omegaconf import DictConfig

    e, d = f.encoder, f.estimator
    encoder = ref.upsample_encoder.UpsampleConformerEncoder(
        input_size=f.input_size, output_size=e.output_size, attention_heads=e.attention_heads,
        linear_units=e.linear_units, num_blocks=e.num_blocks, dropout_rate=0.0, positional_dropout_rate=0.0,
        attention_dropout_rate=0.0, normalize_before=True, input_layer="linear", pos_enc_layer_type="rel_pos_espnet",
        selfattention_layer_type="rel_selfattn", use_cnn_module=False, macaron_style=False,
        static_chunk_size=e.static_chunk_size)
    encoder.up_layer = ref.upsample_encoder.Upsample1D(channels=512, out_channels=512, stride=e.upsample_stride)
    encoder.up_encoders = encoder.up_encoders[: e.num_up_blocks]
    estimator = ref.decoder.CausalConditionalDecoder(
        in_channels=d.in_channels, out_channels=d.out_channels, channels=list(d.channels), dropout=0.0,
        attention_head_dim=d.attention_head_dim, n_blocks=d.n_blocks, num_mid_blocks=d.num_mid_blocks,
        num_heads=d.num_heads, act_fn="gelu", static_chunk_size=d.static_chunk_size, num_decoding_left_chunks=-1)
    cfm_params = DictConfig({"sigma_min": 1e-06, "solver": "euler", "t_scheduler": "cosine", "training_cfg_rate": 0.2,
                             "inference_cfg_rate": f.inference_cfg_rate, "reg_loss_type": "l1"})
    cfm = ref.flow_matching.CausalConditionalCFM(in_channels=240, cfm_params=cfm_params, n_spks=1, spk_emb_dim=80,
                                                  estimator=estimator)
    return ref.flow.CausalMaskedDiffWithXvec(
        input_size=f.input_size, output_size=f.output_size, spk_embed_dim=f.spk_embed_dim, vocab_size=f.vocab_size,
        input_frame_rate=f.input_frame_rate, token_mel_ratio=f.token_mel_ratio, pre_lookahead_len=f.pre_lookahead_len,
        encoder=encoder, decoder=cfm).eval()


def reference_hift(cfg: CodecConfig):
    ref, h = reference(), cfg.hift
    return ref.generator.HiFTGenerator(
        in_channels=h.in_channels, base_channels=h.base_channels, nb_harmonics=h.nb_harmonics,
        sampling_rate=h.sampling_rate, nsf_alpha=h.nsf_alpha, nsf_sigma=h.nsf_sigma,
        nsf_voiced_threshold=h.nsf_voiced_threshold, upsample_rates=list(h.upsample_rates),
        upsample_kernel_sizes=list(h.upsample_kernel_sizes),
        istft_params={"n_fft": h.istft_n_fft, "hop_len": h.istft_hop_len},
        resblock_kernel_sizes=list(h.resblock_kernel_sizes),
        resblock_dilation_sizes=[list(d) for d in h.resblock_dilation_sizes],
        source_resblock_kernel_sizes=list(h.source_resblock_kernel_sizes),
        source_resblock_dilation_sizes=[list(d) for d in h.source_resblock_dilation_sizes],
        lrelu_slope=h.lrelu_slope, audio_limit=h.audio_limit,
        f0_predictor=ref.f0_predictor.ConvRNNF0Predictor(num_class=1, in_channels=h.in_channels,
                                                         cond_channels=h.f0_cond_channels)).eval()
