"""From a prompt to codes: s2.cpp's sampler (`sampling`), the rule that turns one step's logits
into one frame (`frame`) and the Dual-AR loop around it (`loop`).

    from s2core.generation import GenerationConfig, generate, stream, sample_token
"""

from s2core.generation.loop import (QWEN_IM_END_ID, GenerationConfig, GenerationStats, Sampling,
                                    audio_seconds, generate, stream)
from s2core.generation.sampling import sample_token

__all__ = ["GenerationConfig", "GenerationStats", "Sampling", "generate", "stream",
           "sample_token", "audio_seconds", "QWEN_IM_END_ID"]
