"""Requests and the contracts every part of servesim shares.

Time is integer nanoseconds everywhere inside the simulator and in engine records
(``NS_PER_S``); outputs convert to seconds or milliseconds.

Content is described by *segments*: a segment ``(content_id, length)`` stands for the first
``length`` tokens of an endless token stream named ``content_id`` (an ``int``, ``str`` or a
tuple of those). Two requests that share a segment share those tokens, so prefix reuse
follows from content (a shared system prompt, the earlier turns of a conversation) and block
hashes can be derived for any ``block_size`` (see :meth:`Request.block_hash`).

The types here are the contracts between the workload, the scheduler, the engine and
the simulator:

* :class:`RequestSpec` — what to serve; consumed by the simulator and by the engine's replay.
* :class:`Request` — the live state the scheduler and KV cache manager work on.
* :class:`RequestRecord` — what happened; emitted by the simulator and the engine alike.

``StepPlan`` lives in :mod:`simulator.policy.scheduler`, next to the code that makes it.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:  # pragma: no cover
    from .scheduler import _Clock

NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000
# The latest time a run can hold (int64 ns, with headroom for sums: about 4.6e9 s, 146
# years); also the simulator's "never".
MAX_TIME_NS = 1 << 62
#: Largest token count a workload may hold (a length, or a distribution's centre): far past
#: any model's context, far below int64.
MAX_COUNT = 10**9

#: ``capped`` codes of a request whose ``max_tokens`` max_model_len cut (see
#: :class:`RequestRecord`): lowered to ``max_model_len - prompt``, as vLLM's server does; or
#: asked for more than ``max_model_len`` itself, which vLLM's server refuses (HTTP 400).
CAPPED, CAPPED_ABOVE_MAX_MODEL_LEN = 1, 2

ContentId = Union[int, str, tuple]


def s_to_ns(seconds: float) -> int:
    """Convert seconds (float) to integer nanoseconds, rounding to nearest."""
    return int(round(seconds * NS_PER_S))


def ns_to_s(ns: int) -> float:
    """Convert integer nanoseconds to seconds (float)."""
    return ns / NS_PER_S


def segments_length(segments) -> int:
    """Total tokens of a segment list (sum of lengths)."""
    return sum(length for _, length in segments)


def first_content_key(segments) -> int | None:
    """A key for the content of a segment list's first token (its first non-empty
    segment's content id), or ``None`` for empty content.

    Equal first tokens give equal keys (``hash`` of the content id; block hashes use its
    ``repr``, which is equal only for equal ids), so requests with distinct keys can never
    share a KV block; an accidental key collision only loses that knowledge.
    """
    for cid, length in segments:
        if length > 0:
            return hash(cid)
    return None


@dataclass(frozen=True)
class RequestSpec:
    """What to serve: one request of a workload.

    Attributes:
        request_id: unique id (int or str) within a workload.
        arrival_ns: time the request reaches the engine's queue, ns. For a follow-up turn
            (``after`` set) this is ignored: the turn arrives ``think_time_ns`` after the
            request ``after`` finished.
        prompt: prompt content as segments ``((content_id, length), ...)``.
        max_tokens: output tokens to generate (the request stops earlier only at a stop
            token in the real engine, or at ``max_model_len``).
        output_content_id: content id of this request's answer; a later turn whose prompt
            contains ``(output_content_id, n)`` reuses this answer's KV blocks. Defaults to
            ``("out", request_id)``.
        session_id: conversation this request belongs to (``None`` for single requests).
        after: request id of the previous turn whose finish triggers this one.
        think_time_ns: user think time between ``after`` finishing and this arrival, ns.
        prompt_token_ids: real token ids of the prompt, when known (engine only).
    """

    request_id: Union[int, str]
    arrival_ns: int
    prompt: tuple
    max_tokens: int
    output_content_id: ContentId | None = None
    session_id: Union[int, str, None] = None
    after: Union[int, str, None] = None
    think_time_ns: int = 0
    prompt_token_ids: tuple | None = None

    @property
    def prompt_tokens(self) -> int:
        """Prompt length in tokens."""
        return segments_length(self.prompt)

    @property
    def answer_content_id(self) -> ContentId:
        """Content id of the answer (``output_content_id`` or ``("out", request_id)``)."""
        if self.output_content_id is not None:
            return self.output_content_id
        return ("out", self.request_id)


class RequestState(enum.IntEnum):
    """Lifecycle of a request (vLLM ``RequestStatus`` subset)."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3


@dataclass
class RequestRecord:
    """What happened to one request; emitted by the simulator and by the engine.

    All times are integer ns on the run's clock (0 = start of the run). ``None`` means the
    event did not happen (a rejected request has no first token).

    Attributes:
        request_id, arrival_ns, first_scheduled_ns, first_token_ns, finish_ns: see names.
        prompt_tokens: prompt length. cached_tokens: prefix-cache hit tokens at the first
        admission. output_tokens: tokens generated. preemptions: times preempted.
        replica: index of the replica that served it.
        token_times_ns: time of every output token, when recorded (the engine always does;
            the simulator keeps ITL as runs instead, see ``simulator.metrics``).
        finish_reason: ``length`` (max_tokens / max_model_len), ``stop`` (stop token),
            ``rejected`` (never served: a prompt of max_model_len tokens or more).
        capped: 0, or its ``max_tokens`` asked for more than ``max_model_len -
            prompt_tokens``, so its output was cut at max_model_len (finish ``length``), as
            vLLM's engine and its OpenAI server do (0.32's server lowers max_tokens to
            ``max_model_len - prompt``): :data:`CAPPED`; :data:`CAPPED_ABOVE_MAX_MODEL_LEN`
            when it asked for more than max_model_len itself, which that server refuses
            (HTTP 400) and the engine cuts likewise.
    """

    request_id: Union[int, str]
    arrival_ns: int
    first_scheduled_ns: int | None = None
    first_token_ns: int | None = None
    finish_ns: int | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    preemptions: int = 0
    replica: int = 0
    token_times_ns: list | None = None
    finish_reason: str | None = None
    capped: int = 0


def _digest(parent: bytes, key: bytes) -> bytes:
    # Fixed, unsalted hash so block hashes agree across processes and runs.
    return hashlib.blake2b(parent + key, digest_size=16).digest()


def _content_digest(content_id) -> bytes:
    """8-byte digest naming a content stream (repr is deterministic for int/str/tuple)."""
    return hashlib.blake2b(repr(content_id).encode(), digest_size=8).digest()


_PIECE = struct.Struct("<8sQQ")  # content digest, offset in the content, length


class Request:
    """Live state of one request inside a scheduler (vLLM ``v1/request.py`` analogue).

    Token positions ``0 .. num_prompt_tokens-1`` are the prompt, later positions the
    output. Content is either segments (simulator, engine replay) or token ids (engine
    requests made from text); block hashes follow whichever the request has.

    ``cache_private`` may be set (by whoever knows the whole workload) when no other
    request's content begins with this request's first token: no other request can then
    hit its blocks, so the KV manager skips hashing them unless it is preempted (its own
    re-admission is then the only possible hit). ``output_private`` may be set likewise
    when no request's prompt contains this request's answer (``output_content_id``): no
    other request can then hit a block holding any of its output tokens, so the blocks
    filled while it decodes are hashed only if it is preempted. Schedules are identical
    either way (in an unlimited pool, which keeps hashed blocks forever, only the block ids
    may differ).

    While a request is a *steady decode* (one token per step, see
    :class:`simulator.policy.scheduler.Scheduler`) its ``num_computed_tokens`` and
    ``num_output_tokens`` advance implicitly with the scheduler's clock, so a step costs
    nothing per unchanged request.

    Raises:
        ValueError: empty prompt or ``max_tokens`` < 1.
    """

    __slots__ = (
        "request_id", "arrival_ns", "spec", "prompt_segments", "num_prompt_tokens",
        "max_tokens", "output_content_id", "prompt_token_ids", "output_token_ids",
        "stop_token_ids", "eos_token_id", "sampling", "state", "num_cached_tokens",
        "num_preemptions", "block_ids", "num_registered_blocks", "num_hashed_blocks",
        "cache_private", "output_private", "_block_hashes",
        "_content", "_computed", "_output", "_steady", "_clock", "_epoch", "_seq",
        "finish_reason", "record", "capped",
    )

    def __init__(self, spec: RequestSpec | None = None, *, request_id=None,
                 prompt_token_ids=None, max_tokens: int | None = None, arrival_ns: int = 0,
                 stop_token_ids=(), eos_token_id: int | None = None, sampling=None):
        if spec is not None:
            self.request_id = spec.request_id
            self.arrival_ns = spec.arrival_ns
            self.prompt_segments = tuple(spec.prompt)
            self.num_prompt_tokens = spec.prompt_tokens
            self.max_tokens = spec.max_tokens if max_tokens is None else max_tokens
            self.output_content_id = spec.answer_content_id
            self.prompt_token_ids = (list(spec.prompt_token_ids)
                                     if spec.prompt_token_ids is not None else None)
        else:
            if prompt_token_ids is None:
                raise ValueError("Request needs a RequestSpec or prompt_token_ids")
            self.request_id = request_id
            self.arrival_ns = arrival_ns
            self.prompt_segments = None
            self.prompt_token_ids = list(prompt_token_ids)
            self.num_prompt_tokens = len(self.prompt_token_ids)
            self.max_tokens = max_tokens if max_tokens is not None else 16
            self.output_content_id = None
        self.spec = spec
        if self.num_prompt_tokens < 1:
            raise ValueError(f"request {self.request_id}: prompt is empty")
        if self.max_tokens < 1:
            raise ValueError(f"request {self.request_id}: max_tokens must be >= 1, "
                             f"got {self.max_tokens}")
        self.output_token_ids: list[int] | None = (
            [] if self.prompt_token_ids is not None else None)
        self.stop_token_ids = tuple(stop_token_ids)
        self.eos_token_id = eos_token_id
        self.sampling = sampling
        self.state = RequestState.WAITING
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        self.block_ids: list[int] = []
        self.num_registered_blocks = 0   # full blocks registered (as vLLM would)
        self.num_hashed_blocks = 0       # of those, put in the prefix cache so far
        self.cache_private = False
        self.output_private = False
        self._block_hashes: list[bytes] = []
        self._content = None  # content table, built on first hash
        self._computed = 0
        self._output = 0
        self._steady = False
        self._clock: _Clock | None = None
        self._epoch = 0
        self._seq = -1
        self.finish_reason: str | None = None
        self.record: RequestRecord | None = None
        self.capped = 0   # CAPPED...: max_tokens lowered to fit max_model_len (add_request)

    # -- counters (lazy while a steady decode) ---------------------------------------
    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is computed (or scheduled to be, within the current step)."""
        if self._steady:
            return self._computed + self._clock.sched_tick
        return self._computed

    @num_computed_tokens.setter
    def num_computed_tokens(self, value: int) -> None:
        """Set the tokens whose KV is computed (not while the steady-decode clock runs it).

        Raises:
            AssertionError: the steady-decode clock runs this request (assertions on).
        """
        assert not self._steady
        self._computed = value

    @property
    def num_output_tokens(self) -> int:
        """Output tokens sampled so far."""
        if self._steady:
            return self._output + self._clock.update_tick
        return self._output

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens (vLLM ``Request.num_tokens``)."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def is_finished(self) -> bool:
        """Whether it has finished (a stop token, max_tokens or max_model_len, an abort)."""
        return self.state == RequestState.FINISHED

    # -- content and block hashes -----------------------------------------------------
    def _content_table(self) -> list:
        """``[(content digest, first position, end position)]`` of prompt then output."""
        table, pos = [], 0
        for cid, length in self.prompt_segments:
            table.append((_content_digest(cid), pos, pos + length))
            pos += length
        table.append((_content_digest(self.output_content_id), pos, 1 << 62))
        return table

    def block_hashes(self, n: int, block_size: int) -> list[bytes]:
        """Chained hashes of full blocks ``0 .. n-1`` for ``block_size`` (a cached list).

        ``hash_i = blake2b(hash_{i-1} || content_i)`` (vLLM ``hash_block_tokens``). Content
        of a block is its token ids, or for segment requests the pieces it covers, each
        ``(content digest, offset in that content, length)`` — so equal content hashes
        equally whatever the segment boundaries and the block size. Only blocks whose
        tokens exist may be asked for (``n * block_size <= num_tokens``); a request always
        uses one block size.
        """
        hashes = self._block_hashes
        i = len(hashes)
        if i >= n:
            return hashes
        parent = hashes[-1] if hashes else b""
        bs = block_size
        if self.prompt_segments is None:
            toks = self.prompt_token_ids + self.output_token_ids
            for b in range(i, n):
                parent = _digest(parent, array("q", toks[b * bs:(b + 1) * bs]).tobytes())
                hashes.append(parent)
            return hashes
        table = self._content
        if table is None:
            table = self._content = self._content_table()
        pos = i * bs
        k = 0
        while table[k][2] <= pos:
            k += 1
        pack = _PIECE.pack
        for b in range(i, n):
            end = pos + bs
            dig, s0, s1 = table[k]
            if end <= s1:  # one piece: the common case
                key = pack(dig, pos - s0, bs)
                if end == s1:
                    k += 1
            else:
                parts = []
                while pos < end:
                    dig, s0, s1 = table[k]
                    stop = end if end < s1 else s1
                    parts.append(pack(dig, pos - s0, stop - pos))
                    if stop == s1:
                        k += 1
                    pos = stop
                key = b"".join(parts)
            parent = _digest(parent, key)
            hashes.append(parent)
            pos = end
        return hashes

    def block_hash(self, index: int, block_size: int) -> bytes:
        """Chained hash of full block ``index`` (see :meth:`block_hashes`)."""
        hashes = self._block_hashes
        if index < len(hashes):
            return hashes[index]
        return self.block_hashes(index + 1, block_size)[index]

    def append_output_token(self, token_id: int | None = None) -> None:
        """Record one sampled token (explicit mode only; the scheduler calls this)."""
        assert not self._steady
        self._output += 1
        if self.output_token_ids is not None and token_id is not None:
            self.output_token_ids.append(token_id)

    def all_token_ids(self) -> list[int]:
        """Prompt + output token ids (engine requests only)."""
        return self.prompt_token_ids + self.output_token_ids

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.state.name}, prompt="
                f"{self.num_prompt_tokens}, computed={self.num_computed_tokens}, "
                f"out={self.num_output_tokens}/{self.max_tokens})")
