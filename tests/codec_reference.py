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
import torch

from services.vocoder.codec.config import CodecConfig


class _AttrDict(dict):
    """omegaconf's DictConfig as the reference reads it: keys as attributes; a missing one is an AttributeError, as
    copy.deepcopy and pickle expect of any object."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


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


# ---- the reference as a serving stack would run it ------------------------------------------------------------------

def _chunk_mask_without_sync(xs, masks, use_dynamic_chunk, use_dynamic_left_chunk, decoding_chunk_size,
                             static_chunk_size, num_decoding_left_chunks, enable_full_context=True):
    """The reference's add_optional_chunk_mask for its static-chunk and full-context cases (the only ones its encoder
    and estimator call), without the check that reads a count back to the host to warn of an all-masked row: a
    sync that no CUDA graph may hold, and a row of equal-length windows never is all masked."""
    from cosyvoice.utils.mask import subsequent_chunk_mask

    assert not use_dynamic_chunk
    if static_chunk_size > 0:
        return masks & subsequent_chunk_mask(xs.size(1), static_chunk_size, num_decoding_left_chunks, xs.device)[None]
    return masks


class _GraphSafeMasks:
    """Swaps the reference modules' chunk-mask helper for _chunk_mask_without_sync while a call is traced or run."""

    def __enter__(self):
        from cosyvoice.flow import decoder
        from cosyvoice.transformer import upsample_encoder

        self.saved = [(m, m.add_optional_chunk_mask) for m in (decoder, upsample_encoder)]
        for m, _ in self.saved:
            m.add_optional_chunk_mask = _chunk_mask_without_sync

    def __exit__(self, *exc):
        for m, f in self.saved:
            m.add_optional_chunk_mask = f


class ServedReference:
    """The reference's flow as a serving stack would run it (bench/codec.py's "peer at its best"): B streams' windows of
    equal length in one call, the encoder over all B, every Euler step's CFG pair for all B in one estimator batch of
    2B, the weights in `dtype`, and on CUDA the ten Euler steps replayed from one CUDA graph per call shape. The encoder
    runs eagerly, as in CosyVoice's own runtime, whose TensorRT engine is the estimator alone (and the reference's
    encoder copies a host tensor to the GPU, which no graph may hold). The math is the reference's
    `CausalMaskedDiffWithXvec.inference` (streaming, not finalized) and `CausalConditionalCFM.forward` / `solve_euler`,
    batched: row b of a call is what `inference` gives for window b alone (tests/test_codec_peer.py)."""

    def __init__(self, flow, voice, device, dtype=torch.bfloat16, graphs: bool | None = None):
        import copy

        self.flow = copy.deepcopy(flow).to(device=device, dtype=dtype).eval()
        self.device, self.dtype = device, dtype
        self.graphs = device.type == "cuda" if graphs is None else graphs
        self.prompt = voice.prompt_tokens.to(device)                                      # [Tp]
        self.prompt_mel = voice.prompt_mel.to(device=device, dtype=dtype)                # [Tp·ratio, 80]
        with torch.inference_mode():
            e = torch.nn.functional.normalize(voice.embedding[None].to(device=device, dtype=dtype), dim=1)
            self.spks = self.flow.spk_embed_affine_layer(e)                               # [1, 80]
        self.noise = self.flow.decoder.rand_noise.to(device=device, dtype=dtype)         # [1, 80, 15000]
        self._graphs = {}  # mu's shape → (graph, mu in, cond in, mel out)

    def _encode(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [B, Tp + Tw] (prompt, then the window with its look-ahead) → (mu, cond), each [B, 80, frames]."""
        f, B = self.flow, tokens.shape[0]
        lookahead = f.pre_lookahead_len
        token_len = torch.full((B,), tokens.shape[1], device=self.device, dtype=torch.long)
        x = f.input_embedding(torch.clamp(tokens, min=0).long())                         # [B, T, 512] (mask: all 1)
        x, context = x[:, :-lookahead], x[:, -lookahead:]
        h, _ = f.encoder(x, token_len, context=context, streaming=True)
        h = f.encoder_proj(h)                                                             # [B, frames, 80]
        cond = torch.zeros_like(h)
        cond[:, : self.prompt_mel.shape[0]] = self.prompt_mel
        return h.transpose(1, 2).contiguous(), cond.transpose(1, 2).contiguous()

    def _solve(self, mu: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """mu, cond [B, 80, frames] → mel [B, 80, frames after the prompt] in float32: the reference's ten Euler steps."""
        cfm, (B, _, frames) = self.flow.decoder, mu.shape
        mask = torch.ones(B, 1, frames, device=self.device, dtype=mu.dtype)
        spks = self.spks.expand(B, -1)
        x = self.noise[:, :, :frames].expand(B, -1, -1)
        t_span = torch.linspace(0, 1, 11, device=self.device, dtype=mu.dtype)
        if cfm.t_scheduler == "cosine":
            t_span = 1 - torch.cos(t_span * 0.5 * torch.pi)
        t, dt = t_span[0][None], t_span[1] - t_span[0]
        zeros_mu, zeros_spks, zeros_cond = torch.zeros_like(mu), torch.zeros_like(spks), torch.zeros_like(cond)
        for step in range(1, len(t_span)):
            # The CFG pair of every row in one batch: [conditioned rows | unconditioned rows].
            dphi = cfm.estimator(torch.cat([x, x]), torch.cat([mask, mask]), torch.cat([mu, zeros_mu]), t.expand(2 * B),
                                 torch.cat([spks, zeros_spks]), torch.cat([cond, zeros_cond]), streaming=True)
            d, d_cfg = dphi[:B], dphi[B:]
            x = x + dt * ((1.0 + cfm.inference_cfg_rate) * d - cfm.inference_cfg_rate * d_cfg)
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
        return x.float()[:, :, self.prompt_mel.shape[0]:]

    @torch.inference_mode()
    def __call__(self, windows: list[list[int]]) -> torch.Tensor:
        """B windows of equal length → mel [B, 80, frames after the prompt] (float32)."""
        tokens = torch.stack([torch.cat([self.prompt, torch.tensor(w, device=self.device)]) for w in windows])
        with _GraphSafeMasks():
            mu, cond = self._encode(tokens)
            if not self.graphs:
                return self._solve(mu, cond)
            key = tuple(mu.shape)
            if key not in self._graphs:
                static_mu, static_cond = mu.clone(), cond.clone()
                side = torch.cuda.Stream(self.device)
                side.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(side):
                    for _ in range(2):
                        self._solve(static_mu, static_cond)
                torch.cuda.current_stream(self.device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = self._solve(static_mu, static_cond)
                self._graphs[key] = (graph, static_mu, static_cond, out)
            graph, static_mu, static_cond, out = self._graphs[key]
            static_mu.copy_(mu)
            static_cond.copy_(cond)
            graph.replay()
            return out.clone()
