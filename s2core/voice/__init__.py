"""Voices: s2.cpp's `.s2voice` file (`file`) and the directory of saved voices with their stored
KV prefixes (`library`)."""

from s2core.voice.file import Voice, read_s2voice, write_s2voice
from s2core.voice.library import VoiceLibrary

__all__ = ["Voice", "VoiceLibrary", "read_s2voice", "write_s2voice"]
