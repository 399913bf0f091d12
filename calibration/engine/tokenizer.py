"""Tokenizers: HF ``tokenizers`` when a model directory has ``tokenizer.json``, else bytes.

Also :func:`content_tokens`, the deterministic token ids of a content stream, used to
materialise a :class:`simulator.policy.RequestSpec`'s segments as token ids.
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
        """Token ids of ``text``: one per UTF-8 byte, so a prompt of n bytes is n tokens.

        Raises:
            InputError: text UTF-8 cannot encode (a lone surrogate), or a byte >=
                ``vocab_size``.
        """
        _check_text(text)
        ids = list(text.encode("utf-8"))
        bad = [b for b in ids if b >= self.vocab_size]
        if bad:
            raise InputError(f"prompt: byte {bad[0]:#x} is outside the model's vocab of "
                             f"{self.vocab_size} (no tokenizer.json; pass token ids)")
        return ids

    def decode(self, ids) -> str:
        """Text of token ids (an iterable of ints): ids 256 and above are dropped (the
        model may sample any id of its vocab) and invalid UTF-8 becomes U+FFFD.

        Raises:
            ValueError: a negative id.
        """
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def _check_text(text: str) -> None:
    """Text encodes as UTF-8 (a lone surrogate such as ``"\\ud800"`` does not).

    Raises:
        InputError: naming the character's position in the prompt.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"prompt: character {e.start} ({text[e.start]!r}) is a lone "
                         f"surrogate, not text UTF-8 can encode") from None


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` loaded from ``tokenizer.json``."""

    def __init__(self, path):
        """Raises: InputError: a file ``tokenizers`` cannot read, naming it."""
        from tokenizers import Tokenizer
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:   # tokenizers raises a bare Exception with serde's words
            raise InputError(f"{path}: not a tokenizer.json the tokenizers library reads "
                             f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                             ) from None
        self.vocab_size = self._tok.get_vocab_size()
        self.eos_token_id = None

    def encode(self, text: str) -> list[int]:
        """Raises: InputError: text that is no UTF-8 (a lone surrogate)."""
        _check_text(text)
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        """Text of token ids (an iterable of ints), as ``tokenizers`` decodes them: special
        tokens and ids outside the vocab are left out.

        Raises:
            OverflowError: a negative id.
        """
        return self._tok.decode(list(ids))


def load_tokenizer(model_dir, vocab_size: int):
    """``HFTokenizer`` when ``model_dir/tokenizer.json`` exists, else ``ByteTokenizer``.

    Raises:
        InputError: a ``tokenizer.json`` that is not a file (a folder) or not readable.
    """
    path = None if model_dir is None else Path(model_dir) / "tokenizer.json"
    if path is not None and path.exists():
        if not path.is_file():
            raise InputError(f"{path}: not a file (a tokenizer.json is a file)")
        return HFTokenizer(path)
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
