"""Test-model tools: a GGUF writer in s2.cpp's exact layout and a cache of written models."""

from .model_cache import cache_dir, cached_model
from .writer import (WEIGHT_TYPES, WrittenModel, demo_hparams, random_weight, s2pro_hparams,
                     tiny_hparams, write_model)

__all__ = ["WEIGHT_TYPES", "WrittenModel", "cache_dir", "cached_model", "demo_hparams", "random_weight",
           "s2pro_hparams", "tiny_hparams", "write_model"]
