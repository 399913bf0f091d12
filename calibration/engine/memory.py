"""KV cache sizing, as vLLM does it (``vllm/v1/worker/gpu_worker.py``
``determine_available_memory``; ``vllm/v1/core/kv_cache_utils.py`` for the report).

* cuda: budget = total memory × ``gpu_memory_utilization`` − (weights + activation peak
  of a profiling forward of ``max_num_batched_tokens`` tokens + growth of memory used
  outside torch's allocator during that forward).
* cpu: an explicit ``kv_cache_memory_bytes`` (vLLM's ``VLLM_CPU_KVCACHE_SPACE``).

blocks = budget // (block_size × 2 × layers × kv_heads × head_dim × dtype bytes)
(:func:`simulator.policy.kv_cache.blocks_in_budget`).
"""

from __future__ import annotations

import logging

import torch

from simulator.policy.kv_cache import blocks_in_budget, cdiv

from .attention import AttentionMetadata, PrefillChunk
from .kv_store import kv_bytes_per_block

log = logging.getLogger("servesim.engine")


@torch.inference_mode()
def profile_cuda_kv_budget(model, max_num_batched_tokens: int, max_model_len: int,
                           max_num_seqs: int, gpu_memory_utilization: float) -> int:
    """KV cache memory in bytes on the model's CUDA device (see module docstring).

    The profiling forward runs ``max_num_batched_tokens`` tokens as prefills of up to
    ``max_model_len`` tokens from position 0 (no cache needed) and the LM head on
    ``max_num_seqs`` rows, as vLLM's ``profile_run`` does with its dummy batch and sampler.
    """
    dev = model.device
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    free0, total = torch.cuda.mem_get_info(dev)
    non_torch0 = (total - free0) - torch.cuda.memory_reserved(dev)
    T = max_num_batched_tokens
    meta = AttentionMetadata(slot_mapping=None, max_position=min(T, max_model_len) - 1)
    positions = []
    for start in range(0, T, max_model_len):
        n = min(max_model_len, T - start)
        meta.prefills.append(PrefillChunk(start, n, 0, None, None))
        positions.append(torch.arange(n))
    ids = torch.zeros(T, dtype=torch.long, device=dev)
    hidden = model(ids, torch.cat(positions).to(dev), meta, None)
    model.compute_logits(hidden[:min(max_num_seqs, T)])
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev)
    free1, _ = torch.cuda.mem_get_info(dev)
    non_torch_growth = max(0, (total - free1) - torch.cuda.memory_reserved(dev) - non_torch0)
    budget = int(total * gpu_memory_utilization) - peak - non_torch_growth
    log.info("memory profiling: total %.2f GiB x %.2f, peak torch %.2f GiB (weights + "
             "activations), non-torch growth %.2f GiB -> KV cache memory %.2f GiB",
             total / 2**30, gpu_memory_utilization, peak / 2**30, non_torch_growth / 2**30,
             budget / 2**30)
    return budget


def blocks_for_budget(budget_bytes: int, model_config, block_size: int, dtype) -> int:
    """KV blocks that fit ``budget_bytes`` bytes, a block holding ``block_size`` tokens of
    every layer's K and V in ``dtype`` (a torch dtype); 0 for a budget of 0 or less."""
    per_block = kv_bytes_per_block(model_config.num_hidden_layers, block_size,
                                   model_config.num_key_value_heads, model_config.head_dim,
                                   dtype)
    return blocks_in_budget(budget_bytes, per_block)


def report_kv_cache(num_blocks: int, block_size: int, max_model_len: int,
                    device: str) -> float:
    """Log the KV cache size and the maximum concurrency for ``max_model_len`` tokens per
    request (vLLM's ``_report_kv_cache_config`` lines); returns the concurrency."""
    tokens = num_blocks * block_size
    concurrency = num_blocks / cdiv(max_model_len, block_size)
    log.info("%s KV cache size: %s tokens (%d blocks of %d)", device.upper(),
             f"{tokens:,}", num_blocks, block_size)
    log.info("Maximum concurrency for %s tokens per request: %.2fx", f"{max_model_len:,}",
             concurrency)
    return concurrency
