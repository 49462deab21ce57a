"""The Hugging Face transformers peer of bench/llm_engine.py (the peer docs/benchmarks.md compares against).

A Qwen3-shaped model with MOSS-Speech's dimensions and all of its K/V-holding layers (40 at the real size:
32 shared + 4 text + 4 audio; hidden 4096, intermediate 12288, 32 heads, 8 kv heads, head_dim 128, vocab
151680), random weights built on the device in the model dtype, attention "sdpa". Measured:

- prefill: one forward of P tokens at batch 1 with a fresh cache, logits of the last position only (what
  `generate` asks for, and what our engine computes);
- decode: one forward of 1 new token per sequence at batch B over the past_key_values of a (B × C)-token
  prefill; the cache is cropped back by one position after each timed forward so the context stays C;
- generate: `generate` at batch B from random 128-token prompts, min_new_tokens = max_new_tokens, greedy.

Every measurement is skipped (with the reason) when transformers is missing, the time guard has run out,
or the device runs out of memory; the caller gets a dict with every number and every skip.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Callable

import torch


def transformers_version() -> str | None:
    try:
        import transformers
    except Exception:  # noqa: BLE001 — missing or broken: the peer is skipped either way
        return None
    return transformers.__version__


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def build_peer(cfg, device: torch.device, dtype: torch.dtype):
    """Qwen3ForCausalLM with `cfg`'s dimensions and cfg.num_layers layers, random init on `device`."""
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM

    transformers.logging.set_verbosity_error()
    config = Qwen3Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=False,
        pad_token_id=0,
        use_cache=True,
    )
    config._attn_implementation = "sdpa"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build in the target dtype: 9B parameters in float32 would be 36 GB
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(config)  # HF's init (normal_) runs on the device: well under a second
    finally:
        torch.set_default_dtype(previous)
    model = model.to(dtype).eval()
    if hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation("sdpa")
        except Exception:  # noqa: BLE001 — older versions take the config attribute set above
            pass
    return model


class _Timer:
    def __init__(self, device):
        self.device = device

    def __call__(self, fn) -> float:
        _sync(self.device)
        t = time.perf_counter()
        fn()
        _sync(self.device)
        return time.perf_counter() - t


def measure_peer(cfg, device: torch.device, dtype: torch.dtype, *, prefills: list[int], batches: list[int],
                 contexts: list[int], generate_batches: list[int], generate_prompt: int = 128, generate_new: int = 32,
                 reps: int = 8, time_left: Callable[[], float] = lambda: float("inf"),
                 log: Callable[[str], None] = print, vocab_limit: int = 150000) -> dict:
    """→ {"transformers": version, "build_seconds", "prefill": {P: ms}, "decode": {"BxC": ms},
    "generate": {B: {...}}, "skipped": [reason, ...]}. Stops starting new measurements once time_left() ≤ 0."""
    out = {"transformers": transformers_version(), "prefill": {}, "decode": {}, "generate": {}, "skipped": []}
    if out["transformers"] is None:
        out["skipped"].append("transformers is not importable: no peer")
        log("peer: transformers is not importable; skipping the peer")
        return out
    timer = _Timer(device)
    g = torch.Generator().manual_seed(7)

    def ids(b: int, n: int) -> torch.Tensor:
        return torch.randint(0, vocab_limit, (b, n), generator=g).to(device)

    def skip(what: str, why: str) -> None:
        out["skipped"].append(f"{what}: {why}")
        log(f"peer: {what} skipped: {why}")

    t = time.perf_counter()
    try:
        model = build_peer(cfg, device, dtype)
    except Exception as e:  # noqa: BLE001
        skip("everything", f"building the model failed: {type(e).__name__}: {e}")
        return out
    _sync(device)
    out["build_seconds"] = time.perf_counter() - t
    out["parameters"] = sum(p.numel() for p in model.parameters())
    log(f"peer: Qwen3 {cfg.num_layers} layers, {out['parameters'] / 1e9:.2f}B parameters, built in {out['build_seconds']:.1f}s")

    try:
        with torch.inference_mode():
            # ---- prefill: batch 1, one forward, last position's logits
            for p in prefills:
                if time_left() <= 0:
                    skip(f"prefill {p}", "time guard")
                    continue
                try:
                    times = []
                    for i in range(2 + max(3, reps // 2)):
                        x = ids(1, p)
                        dt = timer(lambda: model(input_ids=x, use_cache=True, logits_to_keep=1))
                        if i >= 2:
                            times.append(dt)
                    out["prefill"][p] = statistics.median(times) * 1e3
                    log(f"peer: prefill {p} tokens: {out['prefill'][p]:.2f} ms")
                except Exception as e:  # noqa: BLE001
                    skip(f"prefill {p}", _why(e))
                    _free(device)

            # ---- decode: one forward of 1 token per sequence over a B x C cache
            for c in contexts:
                too_big = False
                for b in sorted(batches):
                    key = f"{b}x{c}"
                    if too_big:
                        skip(f"decode {key}", "a smaller batch ran out of memory")
                        continue
                    if time_left() <= 0:
                        skip(f"decode {key}", "time guard")
                        continue
                    cache = None
                    try:
                        pre = model(input_ids=ids(b, c), use_cache=True, logits_to_keep=1)
                        cache = pre.past_key_values
                        del pre
                        times = []
                        cropped = True
                        for i in range(2 + reps):
                            x = ids(b, 1)
                            dt = timer(lambda: model(input_ids=x, past_key_values=cache, use_cache=True))
                            if i >= 2:
                                times.append(dt)
                            try:
                                cache.crop(-1)  # back to C positions (negative: remove; v4 and v5 alike)
                            except Exception:  # noqa: BLE001 — keep going: the context then grows by one a forward
                                cropped = False
                        out["decode"][key] = statistics.median(times) * 1e3
                        note = "" if cropped else " (cache.crop failed: context grew by one per forward)"
                        log(f"peer: decode forward batch {b}, context {c}: {out['decode'][key]:.2f} ms{note}")
                    except Exception as e:  # noqa: BLE001
                        skip(f"decode {key}", _why(e))
                        too_big = _is_oom(e)
                    finally:
                        cache = None
                        _free(device)

        # ---- generate: greedy, fixed length
        for b in generate_batches:
            if time_left() <= 0:
                skip(f"generate batch {b}", "time guard")
                continue
            try:
                x = ids(b, generate_prompt)
                mask = torch.ones_like(x)
                kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0)
                if not out["generate"]:  # warm-up
                    model.generate(x, max_new_tokens=2, min_new_tokens=2, **kw)
                res = {}
                dt = timer(lambda: res.setdefault("y", model.generate(x, max_new_tokens=generate_new,
                                                                      min_new_tokens=generate_new, **kw)))
                new = res["y"].shape[1] - generate_prompt
                out["generate"][b] = {"batch": b, "prompt": generate_prompt, "new_tokens": new, "seconds": dt,
                                      "ms_per_token": dt / new * 1e3, "tokens_per_s": b * new / dt}
                log(f"peer: generate batch {b}: {new} tokens from {generate_prompt}-token prompts in {dt:.2f}s: "
                    f"{dt / new * 1e3:.1f} ms per token, {b * new / dt:.0f} tokens/s")
            except Exception as e:  # noqa: BLE001
                skip(f"generate batch {b}", _why(e))
                _free(device)
    finally:
        model = None
        _free(device)
    return out


def _why(e: BaseException) -> str:
    if _is_oom(e):
        return "out of device memory"
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
