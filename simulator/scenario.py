"""Scenario schema: what to serve, on what, configured how.

A scenario is a YAML file validated by :class:`Scenario` (pydantic v2, unknown keys
refused everywhere). :func:`load_scenario` reads it, applies ``--set a.b.c=value``
overrides to the raw mapping, validates, and turns every problem into ONE
:class:`~simulator.errors.InputError` line naming the file (or the ``--set`` flag), the
key path and what is allowed, e.g.::

    chat.yaml:12: engine.max_num_seqs: Input should be greater than or equal to 1 (got 0)
    chat.yaml:12: engine.max_num_seq: unknown key (allowed: block_size, max_num_seqs, ...)
    --set engine.block_size=abc: Input should be a valid integer >= 1 (got 'abc')

The line is the key's (a missing key: its parent's), from the YAML node marks
(:func:`simulator.files.yaml_line`).

Engine knobs carry vLLM's names and defaults (``vllm/config/scheduler.py``,
``vllm/config/cache.py``): block_size 16, gpu_memory_utilization 0.92,
enable_prefix_caching true, scheduler_reserve_full_isl true, enable_chunked_prefill true
(off: max_num_batched_tokens defaults to at least max_model_len); max_num_seqs and
max_num_batched_tokens by device as ``vllm serve`` sets them
(``EngineArgs.get_batch_defaults``, :meth:`Scenario.serving_defaults`). ``max_model_len``
defaults, as in vLLM, to the model's ``max_position_embeddings`` (times a linear or dynamic
RoPE scaling's factor); where vLLM would then
refuse to start because the KV cache cannot hold one such request, servesim instead caps
the default to what the cache holds, as ``--max-model-len auto`` makes vLLM do (vLLM PR
#29431; reports say so), and an explicit ``max_model_len`` that does not fit is an error,
as in vLLM.
"""

from __future__ import annotations

import difflib
import math
import operator
import re
import typing
import unicodedata
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr,
                      ValidationError, WithJsonSchema, field_validator, model_validator)

from .catalog import ModelShape, inline_model_json_schema, load_model
from .errors import (STRICT_SCHEMA, DoesNotFit, InputError, KeyedInputError, Refused,
                     SubkeyError)
from .files import (echo, load_yaml, name_too_long, read_small_text, yaml_error_text,
                    yaml_key_line, yaml_where)
from .policy import SchedulerConfig
from .policy.request import MAX_COUNT

#: The most GPUs a tensor-parallel group of a catalog projection spans: one node of 8
#: (beyond it the all-reduce leaves NVLink / the node's PCIe switch, which the roofline does
#: not price).
MAX_TP = 8
from .policy.kv_cache import GPU_MEMORY_UTILIZATION, cdiv
from .metrics import METRICS, SLO_STAT_PATTERN, SLO_STATS, slo_stat_rank
from .traces import NONBLANK
from .workload import MAX_RATE, WorkloadConfig


# The values vLLM's --block-size accepts (vllm/config/cache.py BlockSize).
BLOCK_SIZES = (1, 8, 16, 32, 64, 128)


def vllm_block_size(v: int) -> int:
    """``v`` when vLLM's ``--block-size`` takes it (:data:`BLOCK_SIZES`): the scenario's
    ``engine.block_size`` and a profile's ``kv.block_size``.

    Raises:
        ValueError: another size (a schema validator's message).
    """
    if v not in BLOCK_SIZES:
        raise ValueError(f"must be {', '.join(map(str, BLOCK_SIZES[:-1]))} or "
                         f"{BLOCK_SIZES[-1]}, as vLLM's --block-size (got {v})")
    return v

#: Most replications a run takes (each is a whole simulation; 95% CIs settle long before).
MAX_REPLICATIONS = 1000

#: Most replicas a deployment has: every replica is simulated step by step, so a value past
#: this is a typo rather than a deployment (and would run for hours).
MAX_REPLICAS = 10_000
#: Largest price, USD per GPU-hour (past any GPU's; a sum over replicas stays printable).
MAX_PRICE = 1e6


#: Longest scenario name (bytes): it names a folder, and file systems take 255 per name.
MAX_NAME_BYTES = 200
#: Most --set flags one command takes (a scenario has under a hundred keys).
MAX_OVERRIDES = 1000

#: Largest scenario file read (bytes): a scenario is a page of YAML; /dev/zero is endless.
MAX_SCENARIO_BYTES = 16 * 2**20


class _Strict(BaseModel):
    model_config = STRICT_SCHEMA


_LINEAR_TERMS = ("base_s", "per_prefill_token_s", "per_decode_seq_s", "per_context_token_s")


class StepTimeConfig(_Strict):
    """Inline step-time model (what-if and tests), instead of a hardware profile.

    Either ``constant_s`` alone (every step takes that long), or the linear form
    ``base_s + per_prefill_token_s * prefill tokens + per_decode_seq_s * decodes +
    per_context_token_s * context tokens`` (missing linear terms are 0). All in seconds,
    finite. The simulated clock ticks in ns: ``constant_s`` is at least 1 ns, and a linear
    step priced below 1 ns (a per-token term is often less) takes 1 ns.
    """

    # either form, not both (a key set to null is absent), as _one_form checks
    model_config = ConfigDict(**STRICT_SCHEMA, json_schema_extra={"oneOf": [
        {"required": ["constant_s"], "properties": {"constant_s": {"type": "number"}}},
        {"anyOf": [{"required": [k], "properties": {k: {"type": "number"}}}
                   for k in _LINEAR_TERMS]}]})

    constant_s: Optional[float] = Field(
        None, ge=1e-9, description="seconds per step (the simulated clock ticks in ns)")
    base_s: Optional[float] = Field(None, ge=0, description="seconds per step")
    per_prefill_token_s: Optional[float] = Field(
        None, ge=0, description="seconds per prefill token")
    per_decode_seq_s: Optional[float] = Field(
        None, ge=0, description="seconds per decoding request")
    per_context_token_s: Optional[float] = Field(
        None, ge=0, description="seconds per attended context token (decodes + prefill chunks)")

    @model_validator(mode="after")
    def _one_form(self):
        linear = [getattr(self, k) for k in _LINEAR_TERMS]
        if self.constant_s is not None and any(v is not None for v in linear):
            raise ValueError("give either constant_s, or the linear terms (base_s, "
                             "per_prefill_token_s, per_decode_seq_s, per_context_token_s), "
                             "not both")
        if self.constant_s is None and all(v is None for v in linear):
            raise ValueError("give constant_s or at least one linear term (base_s, "
                             "per_prefill_token_s, per_decode_seq_s, per_context_token_s)")
        if self.constant_s is None and not any(linear):
            raise ValueError("the linear step time is 0 s: give a positive term")
        return self

    @property
    def form(self) -> str:
        """``constant`` or ``linear``."""
        return "constant" if self.constant_s is not None else "linear"


class HardwareConfig(_Strict):
    """Where step costs come from: exactly one of ``profile`` and ``step_time``.

    ``profile`` is a catalog GPU name (roofline projection, labelled *projected*) or a
    calibration profile name or path (labelled *measured*); ``step_time`` an inline form.
    """

    # a key set to null is as good as absent, to the loader and so to the schema
    model_config = ConfigDict(**STRICT_SCHEMA, json_schema_extra={"oneOf": [
        {"required": ["profile"], "properties": {"profile": {"type": "string"}}},
        {"required": ["step_time"], "properties": {"step_time": {"type": "object"},
                                                   "cost_noise": {"const": "none"}}}]})

    profile: Optional[str] = Field(
        None, description="catalog GPU (projected) or calibration profile name/path (measured)",
        json_schema_extra={"pattern": NONBLANK})
    tensor_parallel: int = Field(
        1, ge=1, description="GPUs per replica (vLLM tensor_parallel_size)")
    cost_noise: Literal["none", "empirical"] = Field(
        "none", description="empirical: multiply each step by 1 + a residual of the profile")
    step_time: Optional[StepTimeConfig] = None
    price_per_gpu_hour: Optional[float] = Field(
        None, ge=0, le=MAX_PRICE, description="USD (at most 1e6); overrides the catalog "
                                               "GPU's list price")

    @field_validator("profile")
    @classmethod
    def _named(cls, v):
        if v is not None and not v.strip():   # "" or " " would be a path in the scenario's folder
            raise ValueError("empty: give a catalog GPU or a calibration profile's name or "
                             "path (servesim profiles lists them)")
        return v

    @model_validator(mode="after")
    def _exactly_one(self):
        if (self.profile is None) == (self.step_time is None):
            raise ValueError("give exactly one of profile (a catalog GPU or a calibration "
                             "profile) and step_time")
        if self.step_time is not None and self.cost_noise == "empirical":
            raise ValueError("cost_noise: empirical samples a measured profile's residuals; "
                             "an inline step_time has none (use cost_noise: none)")
        return self


class EngineConfig(_Strict):
    """vLLM engine knobs (same names, same defaults).

    ``max_num_seqs`` and ``max_num_batched_tokens`` default, as in ``vllm serve``, by device
    (see :meth:`Scenario.serving_defaults`); the resolved values are
    :attr:`Scenario.max_num_seqs` and :attr:`Scenario.max_num_batched_tokens`.
    """

    block_size: int = Field(16, ge=1, description="tokens per KV block: 1, 8, 16, 32, 64 or "
                                                  "128 (the values vLLM's --block-size takes)",
                            json_schema_extra={"enum": list(BLOCK_SIZES)})
    max_num_seqs: Optional[int] = Field(
        None, ge=1, le=MAX_COUNT, description="default as vllm serve: 1024 on GPUs with "
        ">= 70 GiB other than A100 (H100, H200, B200), 256 on other GPUs, 128 per rank on "
        "CPU; at most max_num_batched_tokens")
    max_num_batched_tokens: Optional[int] = Field(
        None, ge=1, le=MAX_COUNT, description="most tokens one step computes; default as "
        "vllm serve: 16384 on GPUs with >= 160 GiB, 8192 on GPUs with >= 70 GiB other than "
        "A100, 2048 on other GPUs, 2048 per rank on CPU; at most max_num_seqs × "
        "max_model_len")
    gpu_memory_utilization: float = Field(GPU_MEMORY_UTILIZATION, gt=0, le=1)
    enable_prefix_caching: bool = True
    max_model_len: Optional[int] = Field(
        None, ge=1, le=MAX_COUNT,
        description="default: the model's max_position_embeddings (times a linear or "
                    "dynamic rope_scaling factor)")
    num_gpu_blocks: Optional[int] = Field(
        None, ge=2, le=MAX_COUNT,
        description="KV blocks incl. the null block; overrides the computed count")
    scheduler_reserve_full_isl: bool = Field(True, description=(
        "admit a waiting request only when its whole prompt fits in the free KV blocks, not "
        "only its first chunk (vLLM's knob and default)"))
    watermark: float = Field(0.0, ge=0, lt=1, description=(
        "share of the KV blocks kept free when a waiting or preempted request is admitted "
        "while others run: room for the running to grow before preemption (vllm serve "
        "--watermark, default 0)"))
    long_prefill_token_threshold: int = Field(0, ge=0, le=MAX_COUNT, description=(
        "most prompt tokens one request computes per step while others run or wait, so a "
        "long prompt leaves room in max_num_batched_tokens to the rest (vllm serve "
        "--long-prefill-token-threshold; 0, the default: no cap)"))
    enable_chunked_prefill: bool = Field(True, description=(
        "cut a prompt into chunks of what a step's max_num_batched_tokens leaves (vLLM's "
        "default); false: a prompt runs whole or waits, and max_num_batched_tokens defaults "
        "to at least max_model_len and must be at least that (vllm serve "
        "--no-enable-chunked-prefill)"))

    _vllm_block_size = field_validator("block_size")(vllm_block_size)


class ClusterConfig(_Strict):
    """Replicas of the engine behind a router."""

    replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    router: Literal["round_robin", "least_outstanding", "prefix_affinity",
                    "session_affinity"] = "round_robin"


SLO_METRICS = METRICS   # every metric the summary reports can carry an SLO


#: Largest SLO bound, ms (11.6 days: any latency target is far below it).
MAX_SLO_MS = 1e9


def _slo_target(bounds: dict) -> dict:
    """An SLO target's statistics checked (:func:`simulator.metrics.slo_stat_rank`) and
    put in order: ``mean`` first, then percentiles."""
    if not bounds:
        raise ValueError(f"give at least one statistic ({', '.join(SLO_STATS)}, "
                         f"p99.9, ...)")
    seen: dict = {}
    for k in bounds:   # p99 and p99.0 would be two bounds on one figure
        try:
            rank = slo_stat_rank(k)
        except ValueError as e:   # named at the statistic's own line
            raise SubkeyError(k, str(e)) from None
        if rank in seen:
            raise SubkeyError(k, f"the same statistic as {seen[rank]}: give it once")
        seen[rank] = k
    return {k: bounds[k] for k in sorted(bounds, key=slo_stat_rank)}


#: Upper bounds (ms) on statistics of one metric: ``mean`` or any percentile ``pNN``
#: (p50, p90, p99, p99.9). An entry is met when stat <= bound, or vacuously when the
#: statistic has no samples (TPOT/ITL with every request at <= 1 output token) while
#: requests completed. Bounds are finite (``.inf`` is refused here, with the file's name,
#: rather than after the run by :func:`simulator.metrics.parse_slo`).
SLOTarget = Annotated[
    dict[str, Annotated[float, Field(gt=0, le=MAX_SLO_MS, allow_inf_nan=False)]],
    AfterValidator(_slo_target),
    Field(json_schema_extra={"propertyNames": {"pattern": SLO_STAT_PATTERN},
                             "minProperties": 1},
          description="{mean | pNN: bound in ms}, e.g. {p50: 200, p99.9: 2000}")]


class SLOConfig(_Strict):
    """Latency targets in ms (metric definitions as in ``vllm bench serve``: README, Metrics)."""

    ttft_ms: Optional[SLOTarget] = None
    tpot_ms: Optional[SLOTarget] = None
    itl_ms: Optional[SLOTarget] = None
    e2el_ms: Optional[SLOTarget] = None
    queue_ms: Optional[SLOTarget] = None

    def targets(self) -> list[tuple[str, str, float]]:
        """Every ``(metric, stat, bound_ms)``: metrics in schema order, then ``mean`` and
        percentiles in order."""
        out = []
        for m in SLO_METRICS:
            t = getattr(self, m)
            if t is not None:
                out.extend((m, s, b) for s, b in t.items())
        return out


class SimConfig(_Strict):
    """Simulation controls."""

    replications: int = Field(1, ge=1, le=MAX_REPLICATIONS,
                              description="independent runs with derived seeds")
    warmup_requests: int = Field(0, ge=0, description="first requests left out of statistics")
    exact_steps: bool = Field(False, description="simulate every step (no fast-forward)")


def _price(v: float) -> float:
    # A value check (not a dict one), so the error names plan.prices.<gpu> and its line.
    if not 0 <= v < math.inf:
        raise ValueError(f"a price is a finite number >= 0 (USD per GPU-hour), got {v:g}")
    if v > MAX_PRICE:
        raise ValueError(f"a price is at most {MAX_PRICE:g} USD per GPU-hour, got {v:g}")
    return v


def _candidate_values(values: list) -> list:
    # A value check (not a dict one), so the error names plan.candidates.<key> and its line.
    if not values:
        raise ValueError("give at least one value")
    # as YAML writes them: true, 4, 'h100-sxm' (not Python's repr, True)
    shown = [str(x).lower() if isinstance(x, bool) else repr(x) for x in values]
    twice = given_twice(shown, values, "candidate")
    if twice is not None:
        raise ValueError(twice)
    return values


def given_twice(written: typing.Sequence[str], values: typing.Sequence,
                what: str) -> str | None:
    """``"<v> is given twice ..."`` for the first value of ``values`` equal to an earlier
    one (4 and 4.0 are equal, True and 1 are not), named as written (``written``; the
    earlier spelling too when it differs, as ``yes`` after ``true``), where each value is
    one ``what`` (a sweep point, a plan candidate); None when all differ. Hashable values
    are looked up (a list of 30,000 takes half a minute pair by pair)."""
    first: dict = {}   # (is a bool, value) -> index of its first occurrence
    unhashable: list[int] = []
    for i, x in enumerate(values):
        try:
            j = first.setdefault((isinstance(x, bool), x), i)
        except TypeError:   # a list or mapping: compared with the earlier ones of its kind
            j = next((k for k in unhashable if values[k] == x), i)
            unhashable.append(i)
        if j != i:
            same = "" if written[j] == written[i] else f" (as {written[j]}: one value)"
            return f"{written[i]} is given twice{same}; each value is one {what}, give it once"
    return None


class PlanConfig(_Strict):
    """``plan:``: the candidates ``servesim plan`` compares, and its search controls.

    ``candidates`` maps scenario key paths to the values to try (their cross product is the
    candidate set), e.g. ``{hardware.profile: [h100-sxm, a100-80gb], hardware.tensor_parallel:
    [1, 2], engine.max_num_seqs: [64, 256], cluster.router: [least_outstanding]}``.
    ``prices`` overrides the catalog's USD per GPU-hour by GPU name.
    """

    target_rate: Optional[float] = Field(
        None, gt=0, le=MAX_RATE, description="requests/s the whole deployment must serve "
                                             "(--target-rate overrides; at most 1e9)")
    candidates: dict[str, Annotated[list[Any], AfterValidator(_candidate_values),
                                    Field(json_schema_extra={"minItems": 1})]] = Field(
        default_factory=dict, description="key path -> values to try (cross product)")
    # inf/nan reach _price, whose message gives the unit
    prices: dict[str, Annotated[float, Field(allow_inf_nan=True), AfterValidator(_price),
                                Field(json_schema_extra={"minimum": 0,
                                                         "maximum": MAX_PRICE})]] = Field(
        default_factory=dict, description="GPU name -> USD per GPU-hour (overrides catalog)")
    tolerance: float = Field(0.02, gt=0, lt=0.5, description=(
        "indifference zone: relative bracket width at which the rate search stops, and "
        "SLO margin within which a rate counts as on the boundary"))
    min_replications: int = Field(2, ge=1, le=MAX_REPLICATIONS,
                                  description="replications per rate tried")
    max_replications: int = Field(5, ge=1, le=MAX_REPLICATIONS,
                                  description="cap on replications per rate")
    max_replicas: int = Field(64, ge=1, le=MAX_REPLICAS,
                              description="largest deployment considered")

    @field_validator("candidates")
    @classmethod
    def _what_varies(cls, v):
        seen: dict[str, tuple] = {}   # key -> its parts
        for key in v:
            if not all(p.strip() for p in str(key).split(".")):   # "", "engine..x", " "
                raise ValueError(f"a candidate key is a setting's dotted path, e.g. "
                                 f"engine.max_num_seqs (got {echo(key)})")
            # Two keys for one setting (spaced apart, or a mapping and a key inside it):
            # the later would silently replace the other's values in every candidate.
            parts = tuple(p.strip() for p in key.split("."))
            for other, oparts in seen.items():
                n = min(len(parts), len(oparts))
                if parts[:n] == oparts[:n]:
                    raise SubkeyError(key, (
                        f"names the same key as {other}" if len(parts) == len(oparts) else
                        f"{min(key, other, key=len)} and {max(key, other, key=len)} inside "
                        f"it are both candidates") + "; give each setting once")
            seen[key] = parts
            if key.split(".")[0] in ("plan", "workload", "slo", "sim", "name"):
                raise SubkeyError(key, "candidates vary hardware, model, dtype, engine or "
                                       "cluster keys, not the workload or the SLO")
            if key == "cluster.replicas":   # every candidate's count is what plan finds
                raise SubkeyError(key, "plan sizes the replica count of every candidate "
                                       "itself (up to plan.max_replicas): leave it out")
        return v

    @model_validator(mode="after")
    def _reps(self):
        if self.max_replications < self.min_replications:
            raise ValueError(f"max_replications ({self.max_replications}) must be >= "
                             f"min_replications ({self.min_replications})")
        return self


def serve_batch_defaults(kind: str, memory_bytes: int, name: str = "",
                         tensor_parallel: int = 1) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` that ``vllm serve`` picks on a device of
    ``kind`` ("gpu" or "cpu") with ``memory_bytes`` of memory named ``name`` (vLLM
    ``EngineArgs.get_batch_defaults``, OPENAI_API_SERVER context): 16384 / 1024 on GPUs
    with >= 160 GiB; 8192 / 1024 on GPUs with >= 70 GiB other than A100; 2048 / 256 on other
    GPUs; 2048 / 128 per tensor-parallel rank on CPU."""
    if kind == "cpu":
        return 2048 * tensor_parallel, 128 * tensor_parallel
    if memory_bytes >= 160 * 2**30:
        return 16384, 1024
    if memory_bytes >= 70 * 2**30 and "a100" not in name.lower():
        return 8192, 1024
    return 2048, 256


class Scenario(_Strict):
    """A validated scenario. ``base_dir`` (folder of the scenario file) resolves relative
    paths; ``source`` names the file in error messages."""

    # not blank, as _a_title checks (its length in bytes and printability are the loader's
    # alone); a '/' is refused only where it names a folder (default_folder)
    name: str = Field("scenario", json_schema_extra={
        "pattern": r"^[^\x00]*[^\x00\s][^\x00]*$"})
    model: Union[Annotated[str, Field(json_schema_extra={"pattern": NONBLANK})],
                 Annotated[dict[str, Any], WithJsonSchema(inline_model_json_schema())]] = Field(
        description="catalog name | path to an HF config.json | inline mapping of HF config keys")
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    hardware: HardwareConfig
    # engine, cluster, slo and sim may be left out, or null (--set slo=null: no SLOs):
    # their defaults either way (_defaults_for_null)
    engine: Optional[EngineConfig] = Field(default_factory=EngineConfig)
    cluster: Optional[ClusterConfig] = Field(default_factory=ClusterConfig)
    workload: WorkloadConfig
    slo: Optional[SLOConfig] = Field(default_factory=SLOConfig)
    sim: Optional[SimConfig] = Field(default_factory=SimConfig)
    plan: Optional[PlanConfig] = None

    @field_validator("engine", "cluster", "slo", "sim")
    @classmethod
    def _defaults_for_null(cls, v, info):
        # null unsets a key that may be unset: the section's defaults, as when left out
        return cls.model_fields[info.field_name].default_factory() if v is None else v

    @field_validator("name")
    @classmethod
    def _a_title(cls, v):
        # It titles the reports and names the default output folder, reports/<name>, when
        # --out is not given: whether it is one folder name is checked there (a plan's name
        # in compare, or a run's with --out, is a title only: meta-llama/Llama-3.1-8B).
        if not v.strip():
            raise ValueError(f"must not be empty or blank (it titles the reports and names "
                             f"the default output folder reports/<name>), got {v!r}")
        if not v.isprintable():   # a newline or terminal escape in a folder name and titles
            raise ValueError(f"printable characters only (it names the default output folder "
                             f"reports/<name> and titles the report), got {v!r}")
        if len(v.encode()) > MAX_NAME_BYTES:   # file systems take 255 bytes per name
            raise ValueError(f"at most {MAX_NAME_BYTES} bytes (it names the default output "
                             f"folder reports/<name>), got {len(v.encode())}")
        return v

    def default_folder(self, suffix: str = "") -> Path:
        """``reports/<name><suffix>``, the output folder of run (``suffix`` ``-sweep``,
        ``-plan``: sweep's and plan's) when ``--out`` is not given.

        Raises:
            InputError: the name is no one folder name there (a ``/`` or ``\\`` in it,
                or the folder ``.`` or ``..``), naming the key's line and ``--out``.
        """
        folder = self.name + suffix
        if folder in (".", "..") or any(c in folder for c in "/\\"):
            rule = "no '/' or '\\'" + ("" if suffix else ", not '.' or '..'")
            raise self.error("name", f"{self.name!r} cannot name the default output folder "
                                     f"reports/<name>{suffix}: it must be one folder name "
                                     f"({rule}); give --out, or another name")
        return Path("reports") / folder

    _base_dir: Path = PrivateAttr(default=Path("."))
    _source: str = PrivateAttr(default="<scenario>")
    _shape: Optional[ModelShape] = PrivateAttr(default=None)
    _defaults: Optional[tuple] = PrivateAttr(default=None)
    # Where values came from, for error lines: {key path tuple: --set flag} and the YAML
    # text the file was read from (None when built from a mapping).
    _origins: dict = PrivateAttr(default_factory=dict)
    _text: Optional[str] = PrivateAttr(default=None)
    # The scenario whose file gave `workload` when it is another's (see serving()).
    _workload_of: Optional["Scenario"] = PrivateAttr(default=None)

    @field_validator("model", mode="before")
    @classmethod
    def _model_kind(cls, v):
        if not isinstance(v, (str, dict)):
            raise ValueError("expected a catalog name, a path to an HF config.json or a "
                             "mapping of HF config keys (" + (
                                 _read_as_bool(v) if isinstance(v, bool) else
                                 f"got {echo(v)}") + ")")
        return v

    @property
    def base_dir(self) -> Path:
        """Folder that relative paths in the scenario resolve against."""
        return self._base_dir

    @property
    def source(self) -> str:
        """Name of the scenario file (for error messages)."""
        return self._source

    @property
    def model_shape(self) -> ModelShape:
        """The resolved model (catalog, HF config file or inline mapping)."""
        if self._shape is None:
            self._shape = load_model(self.model, self._base_dir)
        return self._shape

    def error(self, key_path: str, message: str, depends: typing.Sequence[str] = (),
              does_not_fit: bool = False) -> InputError:
        """An :class:`InputError` for this scenario's key ``key_path`` (dotted):
        ``"<file>:LINE: <key_path>: <message>"`` with the line of the key (or of its
        nearest parent the file holds; no line when the scenario was not read from a
        file), or ``"--set <flag>: <message>"`` when a ``--set`` flag gave the key, as in
        schema errors (:func:`_prefix`). ``depends``: further dotted key paths the error
        follows from (``engine.gpu_memory_utilization`` for a KV cache that does not fit);
        ``--set`` flags on them are named too, ``"(with --set a=1, --set b=2)"``.
        ``does_not_fit``: a :class:`~simulator.errors.DoesNotFit` (the model and its KV
        cache do not fit the memory), ``message`` its detail."""
        line = _prefix(tuple(key_path.split(".")), self._source, self._origins, message,
                       self._text, also=depends)
        return DoesNotFit(line, message) if does_not_fit else InputError(line)

    def set_by(self, key_path: str | tuple) -> str | None:
        """The ``--set`` flag (``"key=value"``) that gave ``key_path`` (dotted, or a tuple
        of parts where a part holds dots: a ``plan.candidates`` key) or a key above it;
        None when the value is the file's or the default."""
        loc = (tuple(key_path.split(".")) if isinstance(key_path, str)
               else tuple(map(str, key_path)))
        return next((flag for opath, flag in self._origins.items()
                     if loc[:len(opath)] == opath), None)

    @property
    def workload_owner(self) -> "Scenario":
        """The scenario whose file gave :attr:`workload` (this one unless built by
        :meth:`serving`): its folder resolves the workload's relative paths (a trace, an
        empirical distribution) and its lines name the workload's errors."""
        return self._workload_of or self

    def serving(self, other: "Scenario") -> "Scenario":
        """This scenario (hardware, engine, cluster) serving ``other``'s workload and SLO,
        measured as ``other`` measures it (its ``sim``: replications, warm-up), with the
        workload's relative paths relative to ``other``'s folder (``servesim compare``)."""
        sc = self.model_copy(update={"workload": other.workload, "slo": other.slo,
                                     "sim": other.sim})
        sc._workload_of = other.workload_owner
        return sc

    @property
    def max_model_len(self) -> int:
        """``engine.max_model_len``, or the longest context the model allows (vLLM's
        default: :attr:`simulator.catalog.ModelShape.derived_max_model_len`)."""
        return self.engine.max_model_len or self.model_shape.derived_max_model_len

    def serving_defaults(self) -> tuple[int, int]:
        """``(max_num_batched_tokens, max_num_seqs)`` that ``vllm serve`` picks when they
        are not given (vLLM ``EngineArgs.get_batch_defaults``, OPENAI_API_SERVER context):
        16384 / 1024 on GPUs with >= 160 GiB (B200, B300); 8192 / 1024 on GPUs with >= 70 GiB
        other than A100 (H100, H200); 2048 / 256 on other GPUs; 2048 / 128 per
        tensor-parallel rank on CPU. An inline ``step_time`` names no device and gets the
        generic GPU defaults, 2048 / 256.
        """
        if self._defaults is None:
            hw = self.hardware
            kind, mem, name = "gpu", 0, ""
            if hw.profile is not None:
                from .catalog import list_hardware, load_hardware
                if hw.profile in list_hardware():
                    mem, name = load_hardware(hw.profile).memory_bytes, hw.profile
                else:
                    from .cost_model import load_profile
                    try:
                        dev = load_profile(hw.profile, self.base_dir).device
                        kind, mem, name = dev.kind, dev.memory_bytes, dev.name
                    except InputError:
                        pass  # the cost model reports a bad profile with its own message
            self._defaults = serve_batch_defaults(kind, mem, name, hw.tensor_parallel)
        return self._defaults

    @property
    def max_num_batched_tokens(self) -> int:
        """``engine.max_num_batched_tokens``, or vLLM's default for the device; with
        chunked prefill off, at least ``max_model_len``; at most ``max_num_seqs ×
        max_model_len`` (vLLM
        ``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``)."""
        given = self.engine.max_num_batched_tokens
        if given is not None:
            return given
        default, seqs = self.serving_defaults()
        if not self.engine.enable_chunked_prefill:
            default = max(default, self.max_model_len)
        return min(default, (self.engine.max_num_seqs or seqs) * self.max_model_len)

    @property
    def budget_is_max_model_len(self) -> bool:
        """Whether :attr:`max_num_batched_tokens` is ``max_model_len`` raised above the
        device default because chunked prefill is off (none was given)."""
        return (self.engine.max_num_batched_tokens is None
                and not self.engine.enable_chunked_prefill
                and self.max_model_len > self.serving_defaults()[0])

    @property
    def max_num_seqs(self) -> int:
        """``engine.max_num_seqs``, or vLLM's default for the device capped at
        max_num_batched_tokens (as vLLM does)."""
        given = self.engine.max_num_seqs
        if given is not None:
            return given
        return min(self.serving_defaults()[1], self.max_num_batched_tokens)

    def scheduler_config(self, num_gpu_blocks: int | None) -> SchedulerConfig:
        """The :class:`~simulator.policy.SchedulerConfig` of this scenario.

        Args:
            num_gpu_blocks: KV blocks incl. the null block (``CostModel.num_gpu_blocks``);
                ``None`` = unlimited.

        A default ``max_model_len`` is capped to ``(num_gpu_blocks - 1) * block_size``
        tokens, the most one request can hold.

        Raises:
            DoesNotFit: an explicit ``max_model_len`` needs more KV blocks than the cache
                holds (vLLM refuses to start then too).
            InputError: engine settings the scheduler refuses together (its
                ``SchedulerConfig`` checks), naming ``engine``.
        """
        e = self.engine
        max_len = self.max_model_len
        if e.max_model_len is None and num_gpu_blocks is not None:
            max_len = min(max_len, (num_gpu_blocks - 1) * e.block_size)
        if num_gpu_blocks is not None and cdiv(max_len, e.block_size) > num_gpu_blocks - 1:
            usable = num_gpu_blocks - 1
            # the cache's size: the block count given, or what sizes it from memory
            sized_by = (("engine.num_gpu_blocks", "engine.block_size")
                        if e.num_gpu_blocks is not None else
                        ("engine.block_size", "engine.gpu_memory_utilization", "hardware",
                         "model", "dtype"))
            raise self.error("engine.max_model_len", depends=sized_by, does_not_fit=True,
                             message=(
                f"{max_len} tokens need {cdiv(max_len, e.block_size)} KV blocks of "
                f"{e.block_size} but the cache holds {usable} for requests "
                f"({num_gpu_blocks} blocks less block 0, which vLLM reserves as its null "
                f"block): lower max_model_len (to at most {usable * e.block_size}) or "
                + ("raise engine.num_gpu_blocks (or remove it to size the cache from "
                   "gpu_memory_utilization)" if e.num_gpu_blocks is not None else
                   "give the KV cache more memory")))
        try:
            return SchedulerConfig(
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=self.max_num_batched_tokens,
                max_model_len=max(1, max_len), block_size=e.block_size,
                num_gpu_blocks=num_gpu_blocks, enable_prefix_caching=e.enable_prefix_caching,
                scheduler_reserve_full_isl=e.scheduler_reserve_full_isl,
                watermark=e.watermark,
                # a default max_model_len capped to the cache caps the threshold with it
                long_prefill_token_threshold=min(e.long_prefill_token_threshold, max_len),
                enable_chunked_prefill=e.enable_chunked_prefill)
        except ValueError as err:
            raise self.error("engine", str(err)) from None


# -- loading -------------------------------------------------------------------------------

def load_scenario(path: str | Path, overrides: typing.Sequence[str] = (), *,
                  source: str | None = None, serving: Scenario | None = None,
                  then: typing.Sequence[str] = ()) -> Scenario:
    """Read, override and validate a scenario file.

    Args:
        path: the scenario YAML.
        source: how messages name the file (default its name; ``compare`` gives the path
            when two files share a name).
        serving: the scenario whose ``workload``, ``slo`` and ``sim`` a file without
            those sections takes (``compare`` serves the first plan's through every
            plan: another plan's file may give hardware, engine and cluster alone).
        overrides: ``key.path=value`` strings (``--set``); values parse as YAML scalars or
            flow collections (``engine.max_num_seqs=128``, ``slo.ttft_ms={p99: 500}``),
            read as the file is (:func:`simulator.files.load_yaml`).
        then: overrides applied after ``overrides`` and checked for clashes among
            themselves only (a sweep's first point over its plain flags).

    Raises:
        InputError: missing/unreadable file, YAML syntax error (with its line), bad
            override, or any schema violation; one line naming the file or flag and the
            key path.
    """
    if not str(path).strip():   # Path("") would be the current folder
        raise InputError("scenario: empty path (give a scenario YAML file)")
    path = Path(path)
    name = source or path.name
    try:
        text = read_small_text(path, MAX_SCENARIO_BYTES, "scenario file")
    except FileNotFoundError:
        raise InputError(f"{path}: scenario file not found") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read scenario: {e.strerror}") from None
    try:
        raw = load_yaml(text)
    except yaml.YAMLError as e:
        raise InputError(yaml_error_text(name, e, text)) from None
    if raw is None:   # no bytes, or only comments
        # the whole path, so that /dev/null or a pipe is not named "null"
        raise InputError(f"{path}: the scenario file is empty (a scenario needs at least "
                         f"model, hardware and workload; servesim schema lists every key)")
    if not isinstance(raw, dict):
        raise InputError(f"{name}: a scenario is a mapping of keys (name, model, hardware, "
                         f"...), got {type(raw).__name__}")
    # Another file (a run's summary.json): one line, not an error per key.
    required = [k for k, f in Scenario.model_fields.items() if f.is_required()]
    foreign = [k for k in raw if k not in Scenario.model_fields]
    if foreign and not set(raw) & set(required):
        raise InputError(f"{name}: not a scenario: it has none of {', '.join(required)}, and "
                         f"keys a scenario does not ({_some(foreign)}); servesim schema "
                         f"lists a scenario's keys")
    raw.setdefault("name", path.stem)
    for key in ("workload", "slo", "sim") if serving is not None else ():
        if key not in raw:   # its relative paths (a trace) as the serving file reads them
            raw[key] = _from_cwd((key,), getattr(serving, key).model_dump(
                mode="python", exclude_none=True), serving.base_dir.resolve())
    return scenario_from_dict(raw, path.parent, overrides=overrides, source=name, text=text,
                              overrides_cwd=Path.cwd(), then=then)


def scenario_from_dict(d: dict, base_dir: str | Path = ".", *,
                       overrides: typing.Sequence[str] = (),
                       source: str = "<scenario>", text: str | None = None,
                       overrides_cwd: Path | None = None,
                       then: typing.Sequence[str] = ()) -> Scenario:
    """Validate a raw mapping into a :class:`Scenario` (tests, programmatic use).

    Args:
        d: the raw mapping (not modified).
        base_dir: folder relative paths resolve against.
        overrides: ``key.path=value`` strings, applied before validation.
        overrides_cwd: the folder relative paths in ``overrides`` resolve against (the
            command line's current directory), instead of ``base_dir``
            (:func:`apply_overrides`).
        then: overrides applied after ``overrides`` (:func:`load_scenario`).
        source: name used in error messages.
        text: the YAML ``d`` was read from; errors then give the key's line
            (``source:LINE: key.path: ...``).

    Raises:
        InputError: as :func:`load_scenario`.
    """
    raw, origins = apply_overrides(d, overrides, overrides_cwd)
    if then:
        raw, later = apply_overrides(raw, then, overrides_cwd)
        origins = {**origins, **later}
    try:
        sc = Scenario.model_validate(raw)
    except ValidationError as e:
        raise InputError(format_validation_error(e, source, Scenario, origins,
                                                 text=text)) from None
    sc._base_dir = Path(base_dir)
    sc._source = source
    sc._origins, sc._text = origins, text
    _check_semantics(sc, origins, text)
    return sc



def tp_refusal(shape, tp: int) -> str | None:
    """Why vLLM refuses ``tp``-way tensor parallelism for model ``shape``, or None: it shards
    the attention heads, the KV heads (or replicates them: ``tp`` a multiple of their count)
    and the MLP's intermediate size evenly (QKVParallelLinear, MergedColumnParallelLinear)."""
    kv = shape.num_key_value_heads
    if shape.num_attention_heads % tp:
        return (f"{tp} does not divide the model's num_attention_heads "
                f"({shape.num_attention_heads})")
    if kv % tp and tp % kv:
        return (f"{tp} neither divides the model's num_key_value_heads ({kv}) nor is a "
                f"multiple of it")
    if shape.intermediate_size % tp:
        return (f"{tp} does not divide the model's intermediate_size "
                f"({shape.intermediate_size})")
    return None

def _check_semantics(sc: Scenario, origins: dict, text: str | None) -> None:
    """Checks that need the resolved model.

    Raises:
        Refused: settings each valid that vLLM refuses together (raised after the other
            checks, so that a point of a sweep is skipped for it only when nothing else
            is wrong).
        InputError: any other error.
    """
    refusals = []

    def fail(loc: tuple, msg: str, also=()):
        raise InputError(_prefix(loc, sc.source, origins, msg, text, also)) from None

    def refuse(loc: tuple, msg: str, also=()):
        if not refusals:
            refusals.append(Refused(_prefix(loc, sc.source, origins, msg, text, also),
                                    f"{'.'.join(loc)}: {msg}", sc))

    try:
        shape = sc.model_shape
    except KeyedInputError as e:   # the key's line in the file, or the --set flag
        fail(tuple(e.key.split(".")), e.detail)
    except InputError as e:
        # load_model's messages already start with "model".
        flag = origins.get(("model",))
        raise InputError(f"--set {flag}: {e}" if flag else f"{sc.source}: {e}") from None
    tp = sc.hardware.tensor_parallel
    from .catalog import list_hardware
    one_node = sc.hardware.profile in list_hardware()   # projected: one node at most
    if one_node and tp > MAX_TP:
        fail(("hardware", "tensor_parallel"),
             f"{tp} GPUs span more than one node of {MAX_TP}: the projection prices the "
             f"all-reduce over the GPUs' link within a node only (vLLM across nodes adds "
             f"the network, which it does not model); at most {MAX_TP}, with more replicas "
             f"for more capacity", also=("hardware.profile",))
    if one_node and sc.hardware.cost_noise == "empirical":   # a sweep point of its own
        refuse(("hardware", "cost_noise"), "empirical needs a measured profile's residuals; "
                                           "a projection has none", also=("hardware.profile",))
    why = tp_refusal(shape, tp)
    if why:
        top = min(MAX_TP, shape.num_attention_heads) if one_node else shape.num_attention_heads
        allowed = [t for t in range(1, top + 1) if not tp_refusal(shape, t)]
        refuse(("hardware", "tensor_parallel"),
               f"{why}, as vLLM requires; this model allows "
               f"{', '.join(map(str, allowed))}", also=("model",))
    mnbt, mns = sc.max_num_batched_tokens, sc.max_num_seqs
    if mnbt < mns:
        refuse(("engine",), f"max_num_batched_tokens ({mnbt}) must be >= max_num_seqs "
                            f"({mns}), as vLLM requires")
    if not sc.engine.enable_chunked_prefill and mnbt < sc.max_model_len:
        refuse(("engine", "max_num_batched_tokens"),
               f"{mnbt} is smaller than max_model_len ({sc.max_model_len}) with "
               f"enable_chunked_prefill false: a longer prompt could never be scheduled; "
               f"vLLM requires max_num_batched_tokens >= max_model_len (raise it, lower "
               f"max_model_len, or leave max_num_batched_tokens unset)",
               also=("engine.enable_chunked_prefill", "engine.max_model_len", "model"))
    if sc.engine.max_model_len and sc.engine.max_model_len > shape.derived_max_model_len:
        refuse(("engine", "max_model_len"),
               f"{sc.engine.max_model_len} is longer than the model's "
               f"{shape.max_len_text()}", also=("model",))
    lpt = sc.engine.long_prefill_token_threshold
    if lpt > sc.max_model_len:   # vLLM's check, against the length before any KV cap
        refuse(("engine", "long_prefill_token_threshold"),
               f"{lpt} cannot be greater than max_model_len ({sc.max_model_len}), as vLLM "
               f"requires", also=("engine.max_model_len", "model"))
    prefix = sc.workload.prefix
    if prefix is not None and prefix.shared_tokens >= sc.max_model_len:
        # every prompt starts with it and has a token of its own: vLLM refuses them all
        refuse(("workload", "prefix", "shared_tokens"),
               f"{prefix.shared_tokens} tokens leave no prompt under max_model_len "
               f"({sc.max_model_len}): every request would be rejected; must be < "
               f"{sc.max_model_len}", also=("engine.max_model_len", "model"))
    n, warm = sc.workload.num_requests, sc.sim.warmup_requests
    if n is not None and warm >= n:   # a trace's count is known only once it is read
        fail(("sim", "warmup_requests"), f"{warm} leaves none of the {n} requests "
             f"(workload.num_requests) to measure: must be < {n}",
             also=("workload.num_requests",))
    if refusals:
        raise refusals[0]


def split_override(s: str, seen: dict, hint: str = "") -> tuple[tuple, str]:
    """``key.path=value`` → ``(key path parts, value)``, recording the flag in ``seen``
    (``{parts: flag}``). Below ``plan.candidates`` the rest of the path is one key, a
    dotted scenario key: ``plan.candidates.engine.max_num_seqs`` → ``("plan",
    "candidates", "engine.max_num_seqs")``; below ``slo.<metric>`` too, a statistic such
    as ``p99.9``.

    Raises:
        InputError: ``--set <s>: ...`` for a malformed flag, a list index in the path
            (lists are set whole), or a key already in ``seen`` (the later flag would
            silently win); ``hint`` ends that message.
    """
    if re.search(r"[\x00-\x1f\x7f]", s):   # YAML would fold a newline into a space
        raise InputError(f"--set {s}: a control character (newline, tab, escape) in the "
                         f"flag; give the key and value on one line, printable characters only")
    key, sep, value = s.partition("=")
    parts = tuple(p.strip() for p in key.strip().split("."))
    if sep and any(parts) and not all(parts):   # engine..max_num_seqs, .engine, engine.
        raise InputError(f"--set {s}: an empty key in {key.strip()!r} (a dot at its start or "
                         f"end, or two in a row): key.path=value, e.g. "
                         f"engine.max_num_seqs=128")
    if not sep or not all(parts):   # an empty flag shown as '' (else "--set : expected")
        raise InputError(f"--set {s if s.strip() else repr(s)}: expected key.path=value, "
                         f"e.g. engine.max_num_seqs=128")
    if parts[0] == "slo" and len(parts) > 3:   # a statistic with a dot: slo.ttft_ms.p99.9
        parts = (*parts[:2], ".".join(parts[2:]))
    index = next((i for i, p in enumerate(parts) if p.isdigit()), None)
    if index:   # no list item is addressable on its own (the schema's lists are short)
        raise InputError(f"--set {s}: {parts[index]} is not a key (scenario keys are names; "
                         f"a list is set whole, e.g. workload.trace.window_s=[0, 60])")
    if parts[:2] == ("plan", "candidates") and len(parts) > 3:
        # a candidate's key is itself a dotted scenario key (engine.max_num_seqs)
        parts = (*parts[:2], ".".join(parts[2:]))
    if parts in seen:
        raise InputError(f"--set {s}: {'.'.join(parts)} is already set by --set "
                         f"{seen[parts]} (give each key once{hint})")
    # a mapping and a key inside it: whichever came last would silently win, unless the
    # mapping came first without that key (--set 'workload.arrival={process: closed_loop}'
    # --set workload.arrival.concurrency=2,4,8 adds a key to it)
    inside = next((k for k in seen if (k[:len(parts)] == parts or parts[:len(k)] == k)
                   and not _adds_to(seen[k], parts[len(k):])), None)
    if inside is not None:
        outer, inner = sorted((parts, inside), key=len)
        raise InputError(f"--set {s}: {'.'.join(outer)} and {'.'.join(inner)} inside it are "
                         f"both set (the later flag would override the other; give the key "
                         f"inside the mapping, or the whole mapping, once)")
    seen[parts] = s
    return parts, value


def _adds_to(outer_flag: str, rest: tuple) -> bool:
    """Whether a later flag at ``rest`` below the mapping that ``outer_flag`` sets adds a
    key that mapping lacks (nothing it gave is overridden)."""
    if not rest:
        return False
    try:
        node = load_yaml(outer_flag.partition("=")[2])
    except yaml.YAMLError:
        return False
    for p in rest[:-1]:
        if not isinstance(node, dict) or p not in node:
            return isinstance(node, dict)
        node = node[p]
    return isinstance(node, dict) and rest[-1] not in node


def _from_cwd(parts: tuple, val, cwd: Path):
    """``val`` (set at key path ``parts``) with its relative file paths made relative to
    ``cwd``: a ``path`` key (a trace, an empirical distribution), and a ``hardware.profile``
    or ``model`` that names a file or folder rather than a catalog entry (it has a ``/``
    or a YAML/JSON suffix); inside a mapping too, and in the value lists of
    ``plan.candidates`` (whose keys are dotted scenario keys)."""
    if isinstance(val, dict):
        return {k: _from_cwd((*parts, str(k)), v, cwd) for k, v in val.items()}
    if parts[:2] == ("plan", "candidates") and len(parts) == 3 and isinstance(val, list):
        return [_from_cwd(tuple(parts[2].split(".")), v, cwd) for v in val]
    if not isinstance(val, str) or not val.strip():   # blank: refused as such, not as cwd
        return val
    if parts[-1] == "path" or (parts in (("hardware", "profile"), ("model",)) and (
            "/" in val or val.endswith((".yaml", ".yml", ".json"))
            or _names_a_file_here(parts, val, cwd))):
        return str(cwd / Path(val).expanduser())   # an absolute path stays as it is
    return val


def _names_a_file_here(parts: tuple, val: str, cwd: Path) -> bool:
    """Whether ``val``, a bare name given to ``model`` or ``hardware.profile``, names a file
    or folder in ``cwd`` (``--set model=my-model`` for ./my-model) rather than a catalog
    model, GPU or profile (those win: a name means what it means anywhere)."""
    from .catalog import list_hardware, list_models
    from .cost_model import list_profiles

    try:
        here = not name_too_long(cwd / val) and (cwd / val).exists()
    except OSError:   # a name the file system refuses is no file here
        return False
    # the catalog (and the profile folders' listing) only when a file of that name is here
    return here and val not in (list_models() if parts == ("model",)
                                else [*list_hardware(), *list_profiles()])


def apply_overrides(d: dict, overrides: typing.Sequence[str],
                    cwd: Path | None = None) -> tuple[dict, dict]:
    """Apply ``key.path=value`` overrides to a deep copy of ``d``; with ``cwd``, a relative
    file path among them (:func:`_from_cwd`) is made relative to ``cwd``: a path typed on
    the command line means what the shell means by it.

    Returns:
        ``(new mapping, {key path tuple: override string})``.

    Raises:
        InputError: ``--set <override>: ...`` for a malformed override, a key given twice
            (the later one would silently win), a YAML error in its value, or a path
            through a non-mapping.
    """
    import copy

    if len(overrides) > MAX_OVERRIDES:   # each is checked against the others: 20,000 take 40 s
        raise InputError(f"--set is given {len(overrides):,} times; at most {MAX_OVERRIDES:,} "
                         f"(put the settings in the scenario file)")
    raw = copy.deepcopy(d)
    origins: dict[tuple, str] = {}
    for s in overrides:
        parts, value = split_override(s, origins)
        if not value.strip():  # a typo must not quietly reset a knob; null says it outright
            raise InputError(f"--set {s}: empty value (give one; null unsets a key that may "
                             f"be unset)")
        try:
            val = load_yaml(value)
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            if re.search(r"[\]}]\s*,\s*[\[{]", value):   # {p99: 1},{p99: 3}: several values
                problem += ("; one value per key (a sweep's values are scalars: sweep a "
                            "key inside the mapping or list, e.g. slo.ttft_ms.p99=200,500)")
            raise InputError(f"--set {s}: value is not valid YAML: {problem}") from None
        node = raw
        for i, p in enumerate(parts[:-1]):
            if node.get(p) is None:
                node[p] = {}
            node = node[p]
            if not isinstance(node, dict):
                held = ".".join(parts[:i + 1])
                raise InputError(f"--set {s}: {held} is {echo(node)}, not a mapping with a "
                                 f"key {parts[i + 1]}; set {held} itself (--set {held}=...)")
        node[parts[-1]] = val if cwd is None else _from_cwd(parts, val, cwd)
    return raw, origins


#: Keys whose value picks the schema of the mapping that holds them (tagged unions).
_TAGS = ("dist", "process")


def _prefix(loc: tuple, source: str, origins: dict, msg: str, text: str | None = None,
            also: typing.Sequence[str] = (), line: int | None = None) -> str:
    """Compose ``<file>[:LINE]: <path>: msg`` (the line when ``text``, the file's YAML, is
    given; ``line``, when given, instead of that of ``loc``), or ``--set <flag>: msg`` when
    a flag set it; ``(with --set ...)`` names the flags that can have caused it: below
    ``loc``, the ``dist``/``process`` tag beside it, or at/above/below a dotted key path of
    ``also``."""
    loc = tuple(str(p) for p in loc)
    path = ".".join(loc)
    setters = [(opath, flag) for opath, flag in origins.items() if loc[:len(opath)] == opath]
    if setters:   # the flag that set the key itself, or the nearest mapping above it,
        # with those that set keys below it (a max=50 beside a flag that made it fixed)
        opath, flag = max(setters, key=lambda o: len(o[0]))
        below = [f for o, f in origins.items() if len(o) > len(loc) and o[:len(loc)] == loc]
        flag += f" (with {', '.join('--set ' + f for f in below)})" if below else ""
        return f"--set {flag}: {msg}" if loc == opath else f"--set {flag}: {path}: {msg}"
    found, held = yaml_where(text, loc) if text is not None and loc else (None, len(loc))
    line = found if line is None else line
    if held < len(loc):   # the file lacks the key: a flag below it made it (a typo in
        made = loc[:held + 1]   # its path: --set engin.block_size=8) or the mapping above
        maker = next((f for o, f in origins.items() if o[:len(made)] == made), None)
        if maker is not None:   # say so: the user may not know the file lacks it
            return (f"--set {maker}: {path}: {msg} (the file has no {'.'.join(made)}; "
                    "this flag makes one)")
    if line is not None:
        source = f"{source}:{line}"
    # Flags that can have caused the error: those that set this key's value below it,
    # the tag of the mapping holding it (--set x.dist=uniform makes the file's x.median
    # unknown), and those at, above or below a key in ``also``. A flag that sets an
    # unrelated key beside it (workload.num_requests beside workload.seed) is not named.
    deps = [tuple(a.split(".")) for a in also]
    flags = [flag for opath, flag in origins.items()
             if loc and (opath[:len(loc)] == loc
                         or (opath[-1] in _TAGS and opath[:-1] == loc[:-1])
                         or any(opath[:len(d)] == d or d[:len(opath)] == opath
                                for d in deps))]
    if flags:
        return f"{source} (with {', '.join('--set ' + f for f in flags)}): {path}: {msg}"
    return f"{source}: {path}: {msg}" if path else f"{source}: {msg}"


def format_validation_error(e: ValidationError, source: str, root: type | None = None,
                            origins: dict | None = None, text: str | None = None) -> str:
    """One line for a pydantic ``ValidationError`` of model ``root`` read from ``source``:
    ``"<source>[:LINE]: <key.path>: <what is wrong / allowed>"``, unknown keys first, keys
    missing from one mapping named together, with a count of further errors and their
    keys. ``LINE``
    (the key's line, :func:`simulator.files.yaml_line`) is given when ``text``, the YAML
    that was validated, is."""
    # Unknown keys first: a typo often causes the other errors (a required key "missing").
    errs = sorted(e.errors(include_url=False), key=lambda x: x["type"] != "extra_forbidden")
    root = root or Scenario
    msg, shown = _format_error(errs[0], source, origins or {}, root, text), 1
    # Several unknown keys, or several missing ones, in one mapping are named together
    # (a uniform written with low/high: both unknown, and min/max missing).
    here, parent = _resolve_loc(tuple(errs[0]["loc"]), root)
    here = here[:-1]
    same = {"extra_forbidden": [], "missing": []}
    keys = []   # (key path of each error, whether it is one of ``same``)
    for x in errs:
        lc = _resolve_loc(tuple(x["loc"]), root)[0]
        alike = x["type"] in same and lc[:-1] == here
        keys.append((".".join(map(str, lc)), alike))
        if alike:
            same[x["type"]].append(str(lc[-1]))
    unknown, missing = same["extra_forbidden"], same["missing"]
    grouped = len(unknown) > 1 or (not unknown and len(missing) > 1)
    # the keys of the errors not shown, so that one rerun can fix them all
    rest = [k for k, alike in keys if not alike] if grouped else [k for k, _ in keys[1:]]
    if grouped:
        allowed = list(parent.model_fields) if parent is not None else []
        parts = ([f"unknown keys: {_some(unknown)}"
                  + (f" (allowed: {', '.join(allowed)})" if allowed else "")] if unknown
                 else [])
        owned = [(str(x["loc"][-1]), o) for x in errs if x["type"] == "extra_forbidden"
                 and (o := _owning_members(tuple(x["loc"]), root))
                 and _resolve_loc(tuple(x["loc"]), root)[0][:-1] == here]
        if owned:   # as for one such key: which member takes each
            parts.append(_owners_text(owned))
        if missing:
            parts.append(f"required key{'s' if len(missing) > 1 else ''} missing: "
                         f"{', '.join(missing)}")
        msg = _prefix(here, source, origins or {}, "; ".join(parts), text)
        shown = len(unknown) + len(missing)
    if len(errs) > shown:
        more = len(errs) - shown
        named = list(dict.fromkeys(k for k in rest if k))
        msg += (f" (and {more} more error{'s' if more > 1 else ''}"
                + (f", at {_some(named, 4)})" if named else ")"))
    return msg


def _some(names: list[str], n: int = 6) -> str:
    """The first ``n`` names, comma-separated, and how many more."""
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(str(x) for x in names[:n]) + more


def _typo_of(key: str, allowed: list[str]) -> list[str]:
    """The allowed key ``key`` is likely a typo of, in a list of at most one: difflib's
    closest at ratio 0.8 ("blocks" names none), else one with two adjacent letters swapped
    ("mena" for mean, ratio 0.75)."""
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.8)
    swaps = {key[:i] + key[i + 1] + key[i] + key[i + 2:] for i in range(len(key) - 1)}
    return close or [a for a in allowed if a in swaps][:1]


def _format_error(err: dict, source: str, origins: dict, root: type,
                  text: str | None = None) -> str:
    """One line for one pydantic error dict."""
    loc, parent = _resolve_loc(tuple(err["loc"]), root)
    typ = err["type"]
    key_line = None   # the line of a top-level key that is not text
    if typ == "extra_forbidden":
        allowed = list(parent.model_fields) if parent is not None else []
        close = _typo_of(str(loc[-1]), allowed) if loc else []
        msg = ("unknown key" + (f"; did you mean {close[0]}?" if close else "")
               + (f" (allowed: {', '.join(allowed)})" if allowed else ""))
        owners = _owning_members(tuple(err["loc"]), root)
        if owners:   # burstiness left beside a --set process=poisson (median under
            # normal: the close-match hint alone would not say that lognormal takes it)
            msg += "; " + _owners_text([(str(loc[-1]), owners)])
            if (loc[-1], owners[2]) == ("burstiness", "poisson"):   # how to sweep either
                msg += " (process: gamma with burstiness 1 is a Poisson process)"
    elif typ in ("value_error", "assertion_error") and "error" in err.get("ctx", {}):
        msg = str(err["ctx"]["error"])
        if isinstance(err["ctx"]["error"], SubkeyError):
            key = err["ctx"]["error"].key
            loc += key if isinstance(key, tuple) else (key,)
    elif typ == "missing":
        msg = "required key missing"
    elif typ == "invalid_key" or (loc and loc[-1] == "[key]"):
        # A key YAML read as a boolean, number or null (true:, 3:): pydantic puts it in the
        # path (true as 1), and a plain mapping's check adds "[key]": name the mapping.
        key = err.get("input")
        shown = yaml.safe_dump(key).splitlines()[0] if key is None or isinstance(
            key, (bool, int, float)) else repr(key)
        loc = loc[:-2] if loc[-1] == "[key]" else loc[:-1]
        if not loc and text is not None:   # a top-level key: no mapping to name, its line
            key_line = yaml_key_line(text, loc, key)
        msg = f"key {shown} is not text: keys are names" + (
            f" (allowed: {', '.join(parent.model_fields)})"
            if typ == "invalid_key" and parent is not None else "")
        comma = text and isinstance(key, int) and not isinstance(key, bool) and re.search(
            rf"\d,{re.escape(shown)}\s*[,}}]", text)
        if comma:   # {rate: 4,0}: YAML reads the decimal comma as a second entry, key 0
            msg += (f"; in a {{…}} mapping a comma separates entries ({comma[0][:-1]}): a "
                    f"decimal takes a point")
    elif typ in ("model_type", "model_attributes_type"):   # pydantic: "a valid dictionary
        # or instance of <Model>" / "... or object to extract fields from"
        msg = f"must be a mapping of keys (got {echo(err.get('input'))})"
        tags = _union_tags(parent, loc[-1], "dist") if loc else []
        process = _union_tags(parent, loc[-1], "process") if loc else []
        field = getattr(parent, "model_fields", {}).get(loc[-1]) if loc else None
        models = _models_in(field.annotation) if field is not None else []
        if tags:   # a distribution: say how one is written
            msg += (f"; a distribution is {{dist: {tags[0]}, value: N}} or dist: "
                    f"{', '.join(tags[1:])}")
        elif process:   # an arrival process
            msg += f"; e.g. {{process: {process[0]}, rate: N}} (process: {', '.join(process)})"
        elif len(models) == 1:
            msg += f"; its keys: {', '.join(models[0].model_fields)}"
    elif typ == "dict_type":   # pydantic: "Input should be a valid dictionary"
        what = _field_description(parent, str(loc[-1])) if loc else None
        msg = (f"must be a mapping (got {echo(err.get('input'))})"
               + (f": {what}" if what else ""))
    elif typ == "union_tag_invalid":   # pydantic's "Input tag ... found using ..." wording
        ctx = err.get("ctx", {})
        tag = ctx.get("discriminator", "tag").strip("'")
        loc += (tag,)   # the tag's own line
        inp = err.get("input")
        given = inp.get(tag) if isinstance(inp, dict) else None
        msg = (f"{echo(given)} is not one of {ctx.get('expected_tags')} "
               f"({_read_as_bool(given)})" if isinstance(given, bool) else
               f"{ctx.get('tag')!r} is not one of {ctx.get('expected_tags')}")
    elif typ == "union_tag_not_found":  # pydantic: "Unable to extract tag using ..."
        tag = err.get("ctx", {}).get("discriminator", "tag").strip("'")
        tags = _union_tags(parent, loc[-1] if loc else None, tag)
        msg = f"{tag}: required key missing" + (f" (allowed: {', '.join(tags)})"
                                                if tags else "")
    else:
        msg = err["msg"]
        if typ in ("int_type", "int_parsing", "float_type", "float_parsing") and loc:
            msg += _range_text(parent, str(loc[-1]))   # the bounds too, not just the type
        elif typ in ("bool_type", "bool_parsing"):   # a quoted 'false' is text, not false
            msg += ": true or false (or yes/no, on/off), unquoted"
        inp = err.get("input")
        if isinstance(inp, bool) and typ in ("string_type", "literal_error", "enum"):
            msg += f" ({_read_as_bool(inp)})"
        elif (typ in ("int_type", "float_type") and isinstance(inp, str)
                and PLAIN_NUMBER.fullmatch(inp)):
            n = float(inp)   # the number it reads as unquoted (an integer key's as an int)
            plain = str(int(n)) if typ == "int_type" and n.is_integer() else inp.strip()
            msg += f" (got {echo(inp)}: quoted, a number is text; write {plain}, unquoted)"
        elif (typ in ("int_type", "int_parsing", "float_type", "float_parsing")
                and isinstance(inp, str)
                and PLAIN_NUMBER.fullmatch(plain := unicodedata.normalize("NFKC", inp))):
            # YAML reads only 0-9 as digits: full-width ６４ is text
            msg += f" (got {echo(inp)}: YAML reads only the digits 0-9 as a number; write " \
                   f"{plain.strip()})"
        elif (typ in ("int_type", "int_parsing", "float_type", "float_parsing")
                and isinstance(inp, str) and re.fullmatch(r"\s*[-+]?\d+,\d+\s*", inp)
                and tuple(loc) not in origins):   # --set k=4,8 lists values to sweep
            # 4,0 or 1,000: YAML reads a number with a comma as text (in {…}, the comma
            # separates entries instead: key 0)
            whole, part = inp.strip().split(",")
            msg += (f" (got {echo(inp)}: YAML reads a number with a comma as text; write "
                    + (f"{whole}{part})" if typ.startswith("int") else
                       f"{whole}.{part} or {whole}{part})"))
        elif typ in ("finite_number", "int_type") and isinstance(inp, float) \
                and math.isinf(inp):
            msg += (f" (got {echo(inp)}: .inf, or a number past the largest float, 1.8e308)"
                    if inp > 0 else f" (got {echo(inp)}: -.inf, or a number below -1.8e308)")
        elif (typ == "int_type" and isinstance(inp, float) and inp.is_integer()
                and _in_bounds(parent, str(loc[-1]) if loc else "", inp)):
            # 64.0 or 1e3: say how to write it, unless the field's own check refuses it too
            # (block_size 1e12: the sizes vLLM takes, not "write 1000000000000")
            refused = _refusal(parent, str(loc[-1]), int(inp)) if loc else None
            msg = refused or f"{msg} (got {echo(inp)}: write {int(inp)}, without a point or " \
                             f"exponent)"
        elif inp is None or isinstance(inp, (int, float, str, bool, list, dict)):
            msg += f" (got {echo(inp)})"
    return _prefix(loc, source, origins, msg, text, line=key_line)


#: A number as YAML reads one unquoted (``64``, ``-2.5``, ``1e4``): its quoted form is text.
PLAIN_NUMBER = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*", re.ASCII)


def _read_as_bool(value: bool) -> str:
    """Why a boolean stands where text was wanted: YAML 1.1 (PyYAML, and vLLM's config
    files) reads an unquoted no as false: ``"got false: YAML reads unquoted no, off and
    false as false; quote text"``."""
    words = "yes, on and true" if value else "no, off and false"
    return f"got {echo(value)}: YAML reads unquoted {words} as {echo(value)}; quote text"


_BOUND_OPS = (("ge", ">=", operator.ge), ("gt", ">", operator.gt), ("le", "<=", operator.le),
              ("lt", "<", operator.lt))


def _bounds(parent, field: str) -> list[tuple[str, typing.Callable, float]]:
    """``(">=", operator.ge, 1), ...``: the bounds ``parent``'s ``field`` declares
    (``Field(ge=..., le=...)``), in declaration order."""
    info = getattr(parent, "model_fields", {}).get(field)
    return [(op, fn, getattr(m, attr)) for m in (info.metadata if info else ())
            for attr, op, fn in _BOUND_OPS if getattr(m, attr, None) is not None]


def _range_text(parent, field: str) -> str:
    """`` >= 1 and <= 100000000`` for a field of ``parent`` declared with bounds, else
    ``""``."""
    bounds = [f"{op} {v}" for op, _, v in _bounds(parent, field)]
    return " " + " and ".join(bounds) if bounds else ""


def _in_bounds(parent, field: str, value: float) -> bool:
    """Whether ``value`` meets the bounds ``parent``'s ``field`` declares (True without)."""
    return all(fn(value, v) for _, fn, v in _bounds(parent, field))


def _refusal(parent, field: str, value: int) -> str | None:
    """The message with which the field validator of ``parent``'s ``field`` refuses
    ``value`` (``must be 1, 8, 16, 32, 64 or 128, as vLLM's --block-size (got 12)``), or
    None when that field takes it; checks across fields are not run here."""
    try:
        parent.__pydantic_validator__.validate_assignment(parent.model_construct(), field, value)
    except ValidationError as e:
        for err in e.errors():
            if tuple(err["loc"]) == (field,) and err["type"] == "value_error":
                return str(err["ctx"]["error"])
    except AttributeError:   # the field passed; a check across fields met a required key unset
        pass
    return None


def _union_tags(parent, field, tag: str) -> list[str]:
    """The values the discriminator ``tag`` may take in the tagged union of ``parent``'s
    field ``field`` (each member's ``Literal``), or [] when they cannot be read."""
    info = getattr(parent, "model_fields", {}).get(field) if field is not None else None
    out: list[str] = []
    stack = [info.annotation] if info is not None else []
    while stack:
        t = stack.pop(0)
        fields = getattr(t, "model_fields", None)
        if fields and tag in fields:
            out += [str(v) for v in typing.get_args(fields[tag].annotation)]
        else:
            stack += list(typing.get_args(t))
    return out


def _resolve_loc(loc: tuple, root: type) -> tuple[tuple, Any]:
    """Drop pydantic's union-member tags from ``loc`` (``arrival.gamma.rate`` ->
    ``arrival.rate``); also return the model class holding the last key (or None)."""
    out: list = []
    cur: Any = root
    parent = None
    for part in loc:
        models = _models_in(cur)
        if len(models) == 1 and str(part) in models[0].model_fields:
            parent = models[0]
            cur = parent.model_fields[str(part)].annotation
            out.append(part)
            continue
        member = next((m for m in models if _is_tag(m, str(part))), None)
        if member is not None:
            cur = member
            continue
        out.append(part)
        cur, parent = None, (models[0] if len(models) == 1 else None)
    return tuple(out), parent


def _owning_members(loc: tuple, root: type) -> tuple[str, list[str], str] | None:
    """For an unknown key inside a member of a tagged union (``arrival.poisson.burstiness``):
    the union's tag field, the tags of the other members that take that key, and this
    member's tag (``("process", ["gamma"], "poisson")``); None when no other member takes
    it or ``loc`` crosses no union."""
    cur: Any = root
    last = None   # (members, member) of the last union crossed
    for part in loc[:-1]:
        models = _models_in(cur)
        member = next((m for m in models if len(models) > 1 and _is_tag(m, str(part))), None)
        if member is not None:
            last, cur = (models, member), member
        elif len(models) == 1 and str(part) in models[0].model_fields:
            cur = models[0].model_fields[str(part)].annotation
        else:
            return None
    if last is None or cur is not last[1]:   # the key is not the member's own
        return None
    models, member = last
    tag = next((n for n, f in member.model_fields.items()
                if typing.get_origin(f.annotation) is Literal), None)
    if tag is None:
        return None
    theirs = [str(v) for m in models if m is not member and str(loc[-1]) in m.model_fields
              for v in typing.get_args(m.model_fields[tag].annotation)]
    this = ", ".join(map(str, typing.get_args(member.model_fields[tag].annotation)))
    return (tag, theirs, this) if theirs else None


def _owners_text(owned: list[tuple[str, tuple[str, list[str], str]]]) -> str:
    """``"median and p90 are keys of dist: lognormal, not of fixed"`` for unknown keys of one
    union member, each with its :func:`_owning_members`; keys of one owner said together."""
    by_owner: dict[str, list[str]] = {}
    for k, (tag, theirs, _) in owned:
        by_owner.setdefault(f"{tag}: {', '.join(theirs)}", []).append(k)
    said = [f"{' and '.join(keys)} {'are keys' if len(keys) > 1 else 'is a key'} of {who}"
            for who, keys in by_owner.items()]
    return (", ".join(said[:-1]) + (" and " if len(said) > 1 else "")
            + f"{said[-1]}, not of {owned[0][1][2]}")


def _field_description(model: type | None, name: str) -> str | None:
    """The description of ``model``'s field ``name``: the field's own, or that of the
    annotated type it holds (``Optional[SLOTarget]``); None when there is none."""
    field = model.model_fields.get(name) if model is not None else None
    if field is None:
        return None
    todo = [field.annotation]
    while field.description is None and todo:
        ann = todo.pop()
        todo += typing.get_args(ann)
        for meta in getattr(ann, "__metadata__", ()):
            if getattr(meta, "description", None):
                return meta.description
    return field.description


def _models_in(annotation) -> list:
    """BaseModel classes inside an annotation (through Optional, Union, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found = []
    for arg in typing.get_args(annotation):
        for m in _models_in(arg):
            if m not in found:
                found.append(m)
    return found


def _is_tag(model, tag: str) -> bool:
    """Whether pydantic would name union member ``model`` by ``tag`` in an error loc."""
    if model.__name__ == tag:
        return True
    for f in model.model_fields.values():
        if (typing.get_origin(f.annotation) is Literal
                and tag in map(str, typing.get_args(f.annotation))):
            return True
    return False


def scenario_json_schema() -> dict:
    """JSON Schema (draft 2020-12, pydantic's dialect) of the scenario file
    (``servesim schema``)."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            **Scenario.model_json_schema()}


__all__ = ["ClusterConfig", "EngineConfig", "HardwareConfig", "PlanConfig", "SLO_METRICS",
           "SLO_STATS", "SLOConfig", "SLOTarget", "Scenario", "SimConfig", "StepTimeConfig",
           "apply_overrides", "format_validation_error", "load_scenario", "scenario_from_dict",
           "scenario_json_schema", "serve_batch_defaults"]
