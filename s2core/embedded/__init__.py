"""The embedded default assets: random-weight models in s2.cpp's exact GGUF layout, written by
the package itself (weights cannot be downloaded here), and the cache that keeps them.

The demo, the conformance kit, the benchmarks and the tests all use these writers."""

from s2core.embedded.cache import cache_dir, cached_codec, cached_model, demo_codec_path
from s2core.embedded.codec_writer import (CodecConfig, demo_codec_config, s2pro_codec_config,
                                          tiny_codec_config, write_codec)
from s2core.embedded.writer import (WEIGHT_TYPES, WrittenModel, demo_hparams, random_weight, s2pro_hparams,
                     tiny_hparams, write_model)

__all__ = ["CodecConfig", "cached_codec", "demo_codec_config", "demo_codec_path",
           "s2pro_codec_config", "tiny_codec_config", "write_codec", "WEIGHT_TYPES", "WrittenModel", "cache_dir", "cached_model", "demo_hparams", "random_weight",
           "s2pro_hparams", "tiny_hparams", "write_model"]
