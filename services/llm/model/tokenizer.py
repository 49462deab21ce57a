"""Text tokenizer: the checkpoint's tokenizer.json through the `tokenizers` library.

For the tiny preset, `tiny_tokenizer` builds a byte-level tokenizer whose 256 byte tokens are followed
by the special tokens at the ids the tiny config uses.
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


def tiny_tokenizer(cfg: MossSpeechConfig) -> Tokenizer:
    """Byte-level: ids 0..255 are bytes, then the specials at cfg's ids (endoftext = 256 in `tiny`)."""
    # ByteLevel maps every byte to one printable char; its alphabet() is unordered, so rebuild the
    # table to give byte b the id b.
    table = _bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    assert set(vocab) == set(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    base = cfg.endoftext_token_id
    specials = [SPECIAL_NAMES.get(i, f"<|reserved_{i}|>") for i in range(NUM_SPECIAL_TEXT_TOKENS)]
    tok.add_special_tokens(specials)
    for offset, name in SPECIAL_NAMES.items():
        if tok.token_to_id(name) != base + offset:
            raise AssertionError(f"tiny tokenizer: {name} landed at {tok.token_to_id(name)}, want {base + offset}")
    return tok


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
