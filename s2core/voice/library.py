"""A directory of voices: s2.cpp's .s2voice files, each with its KV prefixes per model.

    voices/
      anna.s2voice                                   s2.cpp's file (loads in s2.cpp too)
      anna.<model digest>-f16.kvprefix.safetensors   the voice prefix's K/V for one model file
                                                     and KV cache type (s2core.runtime.prefix)

`--voice NAME` reads NAME.s2voice and restores the prefix file made for the loaded model,
when there is one whose token rows are the voice's prefix; otherwise the prefix is prefilled
and stored for the next time. Several model files (f16, q8_0, ...) each get their own.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from s2core.errors import InvalidInputError, PrefixFileError, VoiceFileError
from s2core.fileio import check_output
from s2core.runtime.prefix import KVPrefix, ModelIdentity
from s2core.voice.file import Voice, read_s2voice, write_s2voice

SUFFIX = ".s2voice"
PREFIX_SUFFIX = ".kvprefix.safetensors"
ENV_VOICES = "S2CORE_VOICES"
#: s2.cpp's default --voice-dir
DEFAULT_DIR = "voices"
#: a voice's longest prefix file name is NAME + 43 characters, plus a temporary suffix
MAX_NAME_CHARS = 128
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def default_directory() -> Path:
    """$S2CORE_VOICES, else ./voices (s2.cpp's default)."""
    return Path(os.environ.get(ENV_VOICES) or DEFAULT_DIR)


class VoiceLibrary:
    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = Path(directory) if directory is not None else default_directory()

    # ------------------------------------------------------------------ voices
    def path_of(self, name_or_path: str | os.PathLike) -> Path:
        """A voice name -> DIR/NAME.s2voice; a path (with a separator or the suffix) as is."""
        text = str(name_or_path)
        if text.endswith(SUFFIX) or os.sep in text or (os.altsep and os.altsep in text):
            return Path(text)
        check_name(text)
        return self.directory / f"{text}{SUFFIX}"

    def names(self) -> list[str]:
        """The voices' names (of regular .s2voice files or symlinks; a FIFO, a device or a
        directory with the suffix is listed and refused when read)."""
        if not self.directory.is_dir():
            return []
        return sorted(p.name[:-len(SUFFIX)] for p in self.directory.iterdir()
                      if p.name.endswith(SUFFIX))

    def load(self, name_or_path: str | os.PathLike) -> tuple[Voice, Path]:
        path = self.path_of(name_or_path)
        return read_s2voice(path), path

    def save(self, name: str, voice: Voice) -> Path:
        check_name(name)
        path = check_output(self.directory / f"{name}{SUFFIX}", (), _voice_error, "voice file")
        return write_s2voice(path, voice)

    # ------------------------------------------------------------------ prefixes
    @staticmethod
    def prefix_path(voice_path: Path, model: ModelIdentity, kv_cache_dtype: str) -> Path:
        stem = voice_path.name[:-len(SUFFIX)] if voice_path.name.endswith(SUFFIX) \
            else voice_path.name
        return voice_path.with_name(f"{stem}.{model.digest[:16]}-{kv_cache_dtype}{PREFIX_SUFFIX}")

    def load_prefix(self, voice_path: Path, model: ModelIdentity, kv_cache_dtype: str
                    ) -> tuple[KVPrefix | None, str]:
        """(the stored prefix, "") or (None, why there is none usable)."""
        path = self.prefix_path(voice_path, model, kv_cache_dtype)
        if not path.exists():
            return None, f"no stored prefix for this model file and a {kv_cache_dtype} cache"
        try:
            prefix = KVPrefix.load(path)
        except PrefixFileError as exc:
            return None, f"the stored prefix is unreadable ({exc})"
        if prefix.model != model:
            return None, "the stored prefix was made by another model file"
        return prefix, ""

    def save_prefix(self, voice_path: Path, prefix: KVPrefix) -> Path:
        return prefix.save(self.prefix_path(voice_path, prefix.model, prefix.kv_cache_dtype))


def check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name) or name.endswith(SUFFIX):
        raise InvalidInputError("voice_name", f"a voice name is letters, digits, '.', '_' and "
                                f"'-', starting with a letter or digit; got {name!r:.120}")
    if len(name) > MAX_NAME_CHARS:
        raise InvalidInputError("voice_name", f"a voice name has at most {MAX_NAME_CHARS} "
                                f"characters (its prefix files' names must fit the file "
                                f"system's 255 bytes); got {len(name)}")


def _voice_error(message: str, check: str) -> VoiceFileError:
    return VoiceFileError(message, check)


def list_command(directory: str | os.PathLike | None, out) -> int:
    """`s2core voices`: each voice with its frames, transcript and stored prefixes."""
    lib = VoiceLibrary(directory)
    try:
        mode = os.stat(lib.directory).st_mode
    except FileNotFoundError:
        mode = stat.S_IFDIR  # none yet: no voices
    except (OSError, ValueError) as exc:
        raise InvalidInputError("voices_dir", f"{lib.directory}: unusable voice directory "
                                f"({getattr(exc, 'strerror', None) or exc})") from None
    if not stat.S_ISDIR(mode):
        raise InvalidInputError("voices_dir", f"{lib.directory} is not a directory")
    names = lib.names()
    if not names:
        print(f"no voices in {lib.directory}", file=out)
        return 0
    print(f"voices in {lib.directory}:", file=out)
    for name in names:
        path = lib.directory / f"{name}{SUFFIX}"
        try:
            voice = read_s2voice(path)
            about = (f"{voice.n_frames} frames ({voice.n_frames * 2048 / voice.sample_rate:.1f} s),"
                     f" {voice.transcript[:60]!r}")
        except VoiceFileError as exc:
            about = f"unreadable: {exc}"
        prefixes = sorted(p.name[len(name) + 1:-len(PREFIX_SUFFIX)]
                          for p in lib.directory.glob(f"{name}.*{PREFIX_SUFFIX}"))
        print(f"  {name:<16} {about}", file=out)
        if prefixes:
            print(f"  {'':<16} KV prefixes (model digest-cache type): {', '.join(prefixes)}",
                  file=out)
    return 0
