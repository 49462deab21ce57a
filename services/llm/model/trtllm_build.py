"""Build the dual-head engine: python -m services.llm.model.trtllm_build CHECKPOINT_DIR OUTPUT_DIR [flags].

CHECKPOINT_DIR is trtllm_checkpoint.py's output; OUTPUT_DIR gets config.json and rank0.engine, the engine directory
trt_runner.py drives (docs/tensorrt.md). Run on a GPU host with TensorRT-LLM installed.

The network is trtllm_model.MossSpeechForCausalLM, built with TensorRT-LLM's own `build` (the function trtllm-build
calls), with the settings the runner requires fixed here rather than left to flags: the GPT attention and GEMM plugins in
the checkpoint's dtype, paged KV, packed input (remove_input_padding), context FMHA with paged context FMHA. The limits
are flags named as trtllm-build's, and must hold the llm's --block-size, --max-num-seqs, --max-num-batched-tokens and
--max-model-len.

Why not trtllm-build itself: it reads config.json through PretrainedConfig.from_json_file, which looks `architecture` up
in TensorRT-LLM's MODEL_MAP — even with --model_cls_file/--model_cls_name — so it would need MossSpeechForCausalLM
registered into MODEL_MAP inside its process (a wrapper script either way, and lost in --workers' spawned processes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from services.llm.model.checkpoint import CheckpointError
from services.llm.model.trtllm_checkpoint import read_config

PLUGIN_DTYPES = ("float32", "float16", "bfloat16")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.llm.model.trtllm_build", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("checkpoint_dir", type=Path, help="the TensorRT-LLM checkpoint (config.json, rank0.safetensors)")
    p.add_argument("output_dir", type=Path, help="the engine directory to write (config.json, rank0.engine)")
    p.add_argument("--tokens_per_block", type=int, default=16, help="KV block size: the llm's --block-size")
    p.add_argument("--max_batch_size", type=int, default=256, help="requests a step: at least the llm's --max-num-seqs")
    p.add_argument("--max_num_tokens", type=int, default=512,
                   help="tokens a step: at least the llm's --max-num-batched-tokens")
    p.add_argument("--max_seq_len", type=int, default=4096, help="positions a sequence: at least the llm's --max-model-len")
    p.add_argument("--max_input_len", type=int, default=None,
                   help="new tokens of one context request in a step (default: --max_seq_len)")
    p.add_argument("--logits_dtype", choices=["float32", "float16"], default="float32")
    p.add_argument("--skip_io_check", action="store_true",
                   help="do not load the built engine to check its IO list against the runner's (trt_io.py)")
    p.add_argument("--log_level", default="info", choices=["verbose", "info", "warning", "error"])
    return p.parse_args(argv)


def build_engine(args: argparse.Namespace) -> None:
    """Checkpoint → engine directory. Raises ValueError for settings the model or the runner can not take."""
    from tensorrt_llm.builder import BuildConfig, build
    from tensorrt_llm.logger import logger
    from tensorrt_llm.plugin import PluginConfig

    from services.llm.model.trtllm_model import MossSpeechForCausalLM, MossSpeechTrtConfig

    logger.set_level(args.log_level)
    config = MossSpeechTrtConfig.from_json_file(str(args.checkpoint_dir / "config.json"))
    if config.dtype not in PLUGIN_DTYPES:
        raise ValueError(f"checkpoint dtype {config.dtype!r}: one of {', '.join(PLUGIN_DTYPES)}")
    if args.max_seq_len > config.max_position_embeddings:
        raise ValueError(f"--max_seq_len {args.max_seq_len} is over the model's {config.max_position_embeddings} positions")
    max_input_len = args.max_input_len or args.max_seq_len
    if not args.max_num_tokens <= max_input_len <= args.max_seq_len:
        raise ValueError(f"need --max_num_tokens ({args.max_num_tokens}) <= --max_input_len ({max_input_len}) <= "
                         f"--max_seq_len ({args.max_seq_len}): a step's context chunk is at most --max_num_tokens tokens")
    config.logits_dtype = args.logits_dtype

    plugins = PluginConfig()
    # set one by one: each release's PluginConfig validates assignments (dtype strings, bools, ints)
    for name, value in {"gpt_attention_plugin": config.dtype, "gemm_plugin": config.dtype, "paged_kv_cache": True,
                        "remove_input_padding": True, "context_fmha": True, "use_paged_context_fmha": True,
                        "tokens_per_block": args.tokens_per_block}.items():
        setattr(plugins, name, value)
    build_config = BuildConfig(max_input_len=max_input_len, max_seq_len=args.max_seq_len,
                               max_batch_size=args.max_batch_size, max_beam_width=1, max_num_tokens=args.max_num_tokens,
                               strongly_typed=True, output_timing_cache=None, plugin_config=plugins)
    if hasattr(build_config, "kv_cache_type"):  # releases that moved paged KV out of the plugin config
        from tensorrt_llm.bindings import KVCacheType
        build_config.kv_cache_type = KVCacheType.PAGED

    model = MossSpeechForCausalLM.from_checkpoint(str(args.checkpoint_dir), config=config)
    engine = build(model, build_config)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    engine.save(str(args.output_dir))


def check_io(engine_dir: Path) -> str:
    """The built engine's IO list as the runner reads it → the TensorRT-LLM layout it matched (EngineRefused if none)."""
    import tensorrt as trt

    from services.llm.runner.trt_io import understand
    from services.llm.runner.trt_runner import ENGINE_FILE, io_list

    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine((engine_dir / ENGINE_FILE).read_bytes())
    if engine is None:
        raise ValueError(f"{engine_dir / ENGINE_FILE}: TensorRT could not deserialize the engine just built")
    return understand(io_list(engine, trt)).variant.name


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        read_config(args.checkpoint_dir)  # a MOSS-Speech TensorRT-LLM checkpoint, before anything heavy
        import tensorrt_llm  # noqa: F401
    except CheckpointError as exc:
        print(f"cannot build: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"cannot build: TensorRT-LLM is not installed ({exc}); build on a GPU host that has it", file=sys.stderr)
        return 2
    try:
        build_engine(args)
        layout = None if args.skip_io_check else check_io(args.output_dir)
    except ValueError as exc:  # EngineRefused is a ValueError too
        print(f"cannot build: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.output_dir / 'config.json'} and {args.output_dir / 'rank0.engine'}"
          + (f" (IO: TensorRT-LLM {layout} layout, as the runner binds it)" if layout else ""))
    print(f"copy the model's tokenizer.json into {args.output_dir} for `moss-serve llm --runner trt`")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
