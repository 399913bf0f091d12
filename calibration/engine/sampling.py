"""Sampling parameters (vLLM ``SamplingParams`` names and defaults) and the sampler."""

from __future__ import annotations

import hashlib
import numbers
import operator
from collections.abc import Mapping
from typing import Annotated

import numpy as np
import torch
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from simulator.errors import InputError


def validation_message(err: ValidationError, prefix: str, model=None) -> str:
    """One line naming the first bad field of a pydantic error, ``prefix.field: msg``; an
    unknown key first (a typo explains the rest), with ``model``'s keys as the allowed."""
    e = min(err.errors(), key=lambda x: x["type"] != "extra_forbidden")
    loc = ".".join(str(x) for x in e["loc"])
    where = f"{prefix}.{loc}" if loc else prefix
    if e["type"] == "extra_forbidden" and model is not None:
        return f"{where}: unknown key (allowed: {', '.join(model.model_fields)})"
    msg = e["msg"].removeprefix("Value error, ")   # a validator's own words
    return f"{where}: {msg} (got {e.get('input')!r})"


#: Temperatures below this sample greedily (vLLM ``sampling_params.py``, ``_SAMPLING_EPS``).
SAMPLING_EPS = 1e-5


def as_integer(v) -> int:
    """An integer of any integer type (Python, NumPy, a 0-d tensor) as a Python int. A
    bool, a float or text is refused: pydantic's lax mode would make "4", 4.0 and True
    the integers 4, 4 and 1, and ``int(1.5)`` would run token 1. So is an array of one element
    and a bool tensor, which torch's ``__index__`` turns into an int (``tensor([[5]])`` is
    5, ``tensor(True)`` is 1): a prompt of such rows would run as a prompt of ids.

    Raises:
        ValueError: anything else, in pydantic's words.
    """
    if isinstance(v, bool) or str(getattr(v, "dtype", "")) in ("torch.bool", "bool"):
        raise ValueError("Input should be a valid integer, not a bool")
    if getattr(v, "ndim", 0) != 0:
        raise ValueError(f"Input should be a valid integer, not an array of shape "
                         f"{tuple(v.shape)}")
    try:
        return operator.index(v)
    except (TypeError, RuntimeError):   # RuntimeError: a meta tensor, which holds no value
        raise ValueError("Input should be a valid integer") from None


def _real(v):
    """A real number of any type (Python, NumPy) as a float; a bool or text is refused."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError("Input should be a valid number")
    try:
        return float(v)
    except OverflowError:   # an integer beyond any float, 10**400
        raise ValueError("Input should be a finite number") from None


def _flag(v):
    """A bool (Python or NumPy); 'yes', 1 and other truthy values are refused."""
    if not isinstance(v, (bool, np.bool_)):
        raise ValueError("Input should be a valid boolean (true or false)")
    return bool(v)


def seed_in_range(v: int) -> int:
    """``v`` if ``torch.Generator.manual_seed`` takes it (-2**63 to 2**64 - 1).

    Raises:
        ValueError: another integer.
    """
    if not -2**63 <= v < 2**64:
        raise ValueError("a seed is from -2**63 to 2**64 - 1 (torch.Generator.manual_seed's "
                         "range)")
    return v


Integer = Annotated[int, BeforeValidator(as_integer)]
Real = Annotated[float, BeforeValidator(_real)]
Flag = Annotated[bool, BeforeValidator(_flag)]


class SamplingParams(BaseModel):
    """How to sample one request's output (names and defaults as vLLM ``SamplingParams``).

    Attributes:
        max_tokens: output tokens at most (vLLM default 16); ``None``: up to
            ``max_model_len`` (the engine gives it ``max_model_len`` − the prompt's length,
            as vLLM's input processor does).
        temperature: below 1e-5 (:data:`SAMPLING_EPS`) greedy, as vLLM; else logits are
            divided by it (vLLM default 1.0).
        top_p: nucleus sampling mass in (0, 1]. top_k: keep the k most likely tokens;
            0 or -1 = all (vLLM accepts both).
        seed: per-request generator seed, -2**63 to 2**64 - 1 (what
            ``torch.Generator.manual_seed`` takes); ``None`` = derived from the engine seed
            and the request id.
        ignore_eos: keep generating past the EOS token (vLLM ``ignore_eos``).
        stop_token_ids: extra token ids that end the request.

    Integers may be of any integer type (NumPy's too), numbers of any real type; text,
    bools where numbers go, fractional or non-finite values are refused.

    Raises:
        InputError: a value of another type or out of range, naming ``sampling.<field>``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_tokens: Integer | None = Field(16, ge=1)
    temperature: Real = Field(1.0, ge=0.0)
    top_p: Real = Field(1.0, gt=0.0, le=1.0)
    top_k: Integer = Field(0, ge=-1)
    seed: Annotated[Integer, AfterValidator(seed_in_range)] | None = None
    ignore_eos: Flag = False
    stop_token_ids: tuple[Integer, ...] = ()

    def __init__(self, **data):
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise InputError(validation_message(e, "sampling", SamplingParams)) from None

    @property
    def greedy(self) -> bool:
        """Whether the argmax is taken: ``temperature`` below :data:`SAMPLING_EPS`, as vLLM
        (dividing logits by 1e-39 overflows them to inf, and the softmax to NaN)."""
        return self.temperature < SAMPLING_EPS


def sampling_params(params) -> SamplingParams:
    """``params`` as :class:`SamplingParams`: one already, a mapping of its fields, or
    ``None`` (the defaults).

    Raises:
        InputError: another type, or a bad field (``sampling.<field>``).
    """
    if isinstance(params, SamplingParams):
        return params
    if params is not None and not isinstance(params, Mapping):
        raise InputError(f"sampling: a SamplingParams or a mapping of its fields (got "
                         f"{type(params).__name__})")
    return SamplingParams(**(params or {}))


def request_generator(params: SamplingParams, engine_seed: int, request_id) -> torch.Generator:
    """CPU generator seeded from ``params.seed``, else from blake2b(engine seed, request
    id) (unsalted, so reruns agree)."""
    seed = params.seed
    if seed is None:
        digest = hashlib.blake2b(repr((engine_seed, request_id)).encode(), digest_size=8)
        seed = int.from_bytes(digest.digest(), "little") >> 1
    return torch.Generator().manual_seed(seed)


def sample(logits: torch.Tensor, params: list, generators: list) -> list[int]:
    """One token id per row of ``logits [N, vocab]`` (float32).

    Greedy rows take the argmax. Other rows: divide by temperature, keep the top-k, then
    the smallest set of tokens whose probability reaches top_p (always at least the most
    likely one), and draw from the renormalised distribution with the row's generator
    (on the CPU, so a seed gives the same tokens on every device).
    """
    out = logits.argmax(dim=-1).tolist()
    for i, p in enumerate(params):
        if p.greedy:
            continue
        row = logits[i].detach().float().cpu() / p.temperature
        if 0 < p.top_k < row.numel():
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = torch.softmax(row, dim=-1)
        if p.top_p < 1.0:
            sorted_p, idx = probs.sort(descending=True)
            # Drop a token when the mass before it already reaches top_p.
            drop = (sorted_p.cumsum(0) - sorted_p) >= p.top_p
            drop[0] = False   # the most likely token stays (a top_p below float32's least
            #                  positive number, 1e-50, compares as 0 and would drop it too)
            probs = probs.scatter(0, idx[drop], 0.0)
        out[i] = int(torch.multinomial(probs, 1, generator=generators[i]))
    return out
