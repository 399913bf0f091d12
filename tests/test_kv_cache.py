"""KV block arithmetic of simulator.policy.kv_cache, against hand-computed values."""

from simulator.catalog import load_model
from simulator.policy.kv_cache import blocks_in_budget, cdiv, min_gpu_blocks

GiB, MiB = 1 << 30, 1 << 20
#: Llama-3.1-8B in bfloat16: 2 (K, V) x 32 layers x 8 KV heads x 128 head_dim x 2 bytes
LLAMA_8B_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2


def test_llama_8b_kv_bytes_per_token_is_128_kib():
    assert LLAMA_8B_KV_BYTES_PER_TOKEN == 128 * 1024
    assert load_model("llama-3.1-8b").kv_bytes_per_token("bfloat16") == 128 * 1024


def test_blocks_in_budget_llama_8b():
    block = 16 * LLAMA_8B_KV_BYTES_PER_TOKEN   # 2 MiB per block of 16 tokens
    assert block == 2 * MiB
    assert blocks_in_budget(1 * GiB, block) == 512
    # floor: a block less one byte more still holds 512, one byte more holds 513
    assert blocks_in_budget(1 * GiB + 2 * MiB - 1, block) == 512
    assert blocks_in_budget(1 * GiB + 2 * MiB, block) == 513
    assert blocks_in_budget(2 * MiB - 1, block) == 0
    assert isinstance(blocks_in_budget(1 * GiB, block), int)


def test_blocks_in_budget_none_below_zero():
    assert blocks_in_budget(0, 4096) == 0
    assert blocks_in_budget(-10 * 4096, 4096) == 0


def test_cdiv_and_min_gpu_blocks():
    assert [cdiv(a, 16) for a in (0, 1, 16, 17, 32)] == [0, 1, 1, 2, 2]
    # 8192 tokens of blocks of 16: 512 blocks plus the null block
    assert min_gpu_blocks(8192, 16) == 513
    assert min_gpu_blocks(8193, 16) == 514


def test_the_engine_and_the_catalog_size_a_kv_block_alike():
    import torch

    from calibration.engine.kv_store import kv_bytes_per_block
    from simulator.catalog import kv_bytes_per_token
    assert kv_bytes_per_token(32, 8, 128, 2) == LLAMA_8B_KV_BYTES_PER_TOKEN
    # 16 tokens of Llama-3.1-8B in bfloat16: 2 MiB, as the catalog's shape prices it
    assert kv_bytes_per_block(32, 16, 8, 128, torch.bfloat16) == 2 * MiB
    assert kv_bytes_per_block(32, 16, 8, 128, torch.float32) == 4 * MiB
