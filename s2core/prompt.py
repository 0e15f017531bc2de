"""s2.cpp's prompt (SPEC 7): `build_prompt`, `split_prompt`, `voice_prefix` (see s2core.text.prompt)."""

from s2core.text.prompt import build_prompt, check_reference, split_prompt, voice_prefix

__all__ = ["build_prompt", "split_prompt", "voice_prefix", "check_reference"]
