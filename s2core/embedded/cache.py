"""A directory of written test models, keyed by everything that determines their bytes.

The demo and the benchmarks write a model once and reuse it: an S2 Pro-sized file takes
minutes to generate. The key hashes the hparams, weight type, seed and writer version.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Callable

from s2core.modelfile.hparams import Hparams
from s2core.embedded.codec_writer import (CODEC_WRITER_VERSION, CodecConfig, demo_codec_config,
                                          s2pro_codec_config, write_codec)
from s2core.embedded.writer import write_model

#: bump when the writer's output for the same arguments changes
WRITER_VERSION = 1


def cache_dir() -> Path:
    """$S2CORE_CACHE, else $XDG_CACHE_HOME/s2core, else ~/.cache/s2core."""
    if os.environ.get("S2CORE_CACHE"):
        return Path(os.environ["S2CORE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "s2core"


def model_path(hp: Hparams, weight_type: str, seed: int = 0, stem: str = "model",
               directory: Path | None = None, codec: CodecConfig | None = None,
               random_blocks: bool = False) -> Path:
    """Where the cache keeps the model file for these arguments (written or not)."""
    fields = {"hp": dataclasses.asdict(hp), "type": weight_type, "seed": seed,
              "writer": WRITER_VERSION}
    if codec is not None:  # a file that carries its codec, as s2.cpp's do
        fields["codec"] = [dataclasses.asdict(codec), CODEC_WRITER_VERSION]
    if random_blocks:  # (absent otherwise: the names of files written before stay valid)
        fields["random_blocks"] = True
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
    return (directory or cache_dir()) / f"{stem}-{weight_type}-{digest}.gguf"


def cached_model(hp: Hparams, weight_type: str, seed: int = 0, stem: str = "model",
                 directory: Path | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 codec: CodecConfig | None = None, random_blocks: bool = False) -> Path:
    """Path of a model file for these arguments, written first if the cache lacks it.
    `codec`: the file carries this codec too (`c.*` tensors, as s2.cpp's files);
    `random_blocks`: quantized tensors hold random valid blocks (write_model's option)."""
    path = model_path(hp, weight_type, seed, stem, directory, codec, random_blocks)
    if not path.exists():
        write_model(path, hp, weight_type, seed=seed, progress=progress, codec=codec,
                    random_blocks=random_blocks)
    return path


def cached_codec(config: CodecConfig, weight_type: str = "f16", seed: int = 0,
                 codec_only: bool = True, stem: str = "codec", directory: Path | None = None,
                 progress: Callable[[int, int], None] | None = None) -> Path:
    """Path of this codec's file in the cache, written first if absent. The name hashes
    everything that decides the bytes."""
    key = json.dumps({"config": dataclasses.asdict(config), "type": weight_type, "seed": seed,
                      "codec_only": codec_only, "writer": CODEC_WRITER_VERSION}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    path = (directory or cache_dir()) / f"{stem}-{weight_type}-{digest}.gguf"
    if not path.exists():
        write_codec(path, config, weight_type, seed=seed, codec_only=codec_only, progress=progress)
    return path


def demo_codec_path(weight_type: str = "f16") -> Path:
    """The embedded demo's codec (`demo_codec_config`), written into the cache on first use."""
    return cached_codec(demo_codec_config(), weight_type, stem="demo-codec")


def s2pro_codec_path(weight_type: str = "f16") -> Path:
    """A codec with S2 Pro's real structure and random weights (0.78 GB in F16), cached."""
    return cached_codec(s2pro_codec_config(), weight_type, stem="s2pro-codec")
