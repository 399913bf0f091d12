"""servesim's real inference engine: a Llama-family model in PyTorch over a paged KV
cache, driven step by step by :mod:`simulator.policy` (what calibration measures and
validation compares the simulator with)."""

import os

# Before torch builds its first oneDNN kernel: room for the kernels the engine builds at
# start-up (model.WARMUP_MAX_ROWS row counts of each weight shape) beside the default 1024.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16384")

from .engine import EngineConfig, LLMEngine, RequestOutput, StepRecord
from .kv_store import KVStore, kv_bytes_per_block
from .model import ModelConfig, Transformer
from .replay import ReplayResult
from .sampling import SamplingParams
from .weights import load_pretrained, random_model, save_pretrained

__all__ = [
    "EngineConfig", "KVStore", "LLMEngine", "ModelConfig", "ReplayResult", "RequestOutput",
    "SamplingParams", "StepRecord", "Transformer", "kv_bytes_per_block", "load_pretrained",
    "random_model", "save_pretrained",
]
