"""Text tokenizer: the checkpoint's tokenizer.json through the `tokenizers` library.

Without a checkpoint, `preset_tokenizer` builds a byte-level tokenizer for any config: 256 byte tokens,
unreachable filler tokens up to <|endoftext|>, then the special tokens at the config's ids (for the
`moss-speech` preset: the real ids and vocabulary size, so a random model runs at the real size).
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from services.llm.model.config import (
    ENDOFTEXT_OFFSET,
    IM_END_OFFSET,
    IM_START_OFFSET,
    MODALITY_PAD_OFFSET,
    NUM_SPECIAL_TEXT_TOKENS,
    SOSP_OFFSET,
    MossSpeechConfig,
)

SPECIAL_NAMES = {
    ENDOFTEXT_OFFSET: "<|endoftext|>",
    IM_START_OFFSET: "<|im_start|>",
    IM_END_OFFSET: "<|im_end|>",
    SOSP_OFFSET: "<|object_ref_start|>",
    MODALITY_PAD_OFFSET: "<|modality_pad|>",
}


def load_tokenizer(directory: str | Path) -> Tokenizer:
    path = Path(directory) / "tokenizer.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: the checkpoint directory must hold tokenizer.json")
    return Tokenizer.from_file(str(path))


def preset_tokenizer(cfg: MossSpeechConfig) -> Tokenizer:
    """Byte-level: ids 0..255 are bytes, 256..endoftext-1 fillers, then the specials at cfg's ids."""
    # ByteLevel maps every byte to one printable char; its alphabet() is unordered, so rebuild the
    # table to give byte b the id b.
    table = _bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    assert set(vocab) == set(pre_tokenizers.ByteLevel.alphabet())
    base = cfg.endoftext_token_id
    # Fillers keep the specials at their real ids. With no merges BPE never produces a multi-char
    # token, so no text encodes to a filler; decoding one gives its name.
    vocab.update({f"<|filler_{i}|>": i for i in range(256, base)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    specials = [SPECIAL_NAMES.get(i, f"<|reserved_{i}|>") for i in range(NUM_SPECIAL_TEXT_TOKENS)]
    tok.add_special_tokens(specials)
    for offset, name in SPECIAL_NAMES.items():
        if tok.token_to_id(name) != base + offset:
            raise AssertionError(f"preset tokenizer: {name} landed at {tok.token_to_id(name)}, want {base + offset}")
    if tok.get_vocab_size() != cfg.vocab_size:
        raise ValueError(f"preset tokenizer: {tok.get_vocab_size()} tokens, config says vocab_size={cfg.vocab_size}")
    return tok


tiny_tokenizer = preset_tokenizer  # the tiny preset's name for it (endoftext = 256: no fillers)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable-character table, which ByteLevel uses."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}
