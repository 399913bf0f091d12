"""servesim's real inference engine: a Llama-family model in PyTorch over a paged KV
cache, driven step by step by :mod:`simulator.policy` (what calibration measures and
validation compares the simulator with)."""

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
