"""Tokenizers: HF ``tokenizers`` when a model directory has ``tokenizer.json``, else bytes.

Also :func:`content_tokens`, the deterministic token ids of a content stream, used to materialise a :class:`simulator.policy.RequestSpec`'s segments as token ids.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from simulator.errors import InputError


class ByteTokenizer:
    """UTF-8 bytes as token ids (byte ``b`` -> id ``b``).

    Raises (``encode``):
        InputError: a byte >= ``vocab_size`` (pass token ids instead).
    """

    eos_token_id = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        ids = list(text.encode("utf-8"))
        bad = [b for b in ids if b >= self.vocab_size]
        if bad:
            raise InputError(f"prompt: byte {bad[0]:#x} is outside the model's vocab of "
                             f"{self.vocab_size} (no tokenizer.json; pass token ids)")
        return ids

    def decode(self, ids) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` loaded from ``tokenizer.json``."""

    def __init__(self, path):
        from tokenizers import Tokenizer
        self._tok = Tokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size()
        self.eos_token_id = None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self._tok.decode(list(ids))


def load_tokenizer(model_dir, vocab_size: int):
    """``HFTokenizer`` when ``model_dir/tokenizer.json`` exists, else ``ByteTokenizer``."""
    if model_dir is not None and (Path(model_dir) / "tokenizer.json").is_file():
        return HFTokenizer(Path(model_dir) / "tokenizer.json")
    return ByteTokenizer(vocab_size)


def content_tokens(content_id, length: int, vocab_size: int) -> list[int]:
    """Token ids at offsets ``0 .. length - 1`` of content stream ``content_id``: the
    SHAKE-128 output of ``repr(content_id)`` read as little-endian uint64, mod
    ``vocab_size``. Equal content gives equal tokens in every run and process (unlike
    Python's salted ``hash``), and a shorter stream is a prefix of a longer one (an
    extendable-output hash), so prefix-cache hits follow content as in the simulator.
    About 0.03 us per token: a replay's prompts cost its engine loop little."""
    raw = np.frombuffer(hashlib.shake_128(repr(content_id).encode()).digest(8 * length),
                        dtype="<u8")
    return (raw % vocab_size).tolist()
