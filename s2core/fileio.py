"""Safe file I/O, written once for every reader and writer of the package.

Readers: `open_regular` refuses what is not a regular file (a FIFO, a device, a directory, a
symlink to one of them) *before* it can block or read without end: it opens without blocking
and checks the open descriptor, so nothing swapped in between slips through. `read_bounded`
reads at most a given number of bytes, refusing a longer file before reading its body.

Writers: `atomic_output` writes to a unique temporary name in the target's directory and
renames it into place, so a reader sees the old file or the new one, never a torn one, and
two writers of the same file never share a temporary name. `check_output` refuses, before any
work, an output path that cannot be a file (empty, a directory, a device, under a file) or
that is one of the command's inputs (same device and inode, through symlinks).

Every refusal raises the caller's error type: `error(message, check)`.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator

ErrorFactory = Callable[[str, str], Exception]


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: read once: os.umask can only be read by setting it, which races with other threads
_UMASK = _read_umask()


class OutputPathError(Exception):
    """Default error of check_output (callers pass their own)."""


def _default_error(message: str, check: str) -> Exception:
    return OutputPathError(f"[{check}] {message}")


def open_regular(path: str | os.PathLike, error: ErrorFactory, what: str = "file") -> IO[bytes]:
    """The file opened for binary reading, or `error` (check `exists`, `not_regular_file`,
    `read`): never blocks on a FIFO, never opens a device or a directory for reading."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{what} not found: {path}", "exists") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a regular file", "not_regular_file") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise error(f"{path}: cannot open: {exc}", "read") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{path}: is {_kind(mode)}, not a regular file", "not_regular_file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_regular(path: str | os.PathLike, error: ErrorFactory, what: str = "file") -> int:
    """The size of a regular file at `path` (through symlinks), or `error` as open_regular."""
    with open_regular(path, error, what) as f:
        return os.fstat(f.fileno()).st_size


def read_bounded(path: str | os.PathLike, max_bytes: int, error: ErrorFactory,
                 what: str = "file") -> bytes:
    """The whole file, refused (`too_large`) before reading when it is longer than max_bytes."""
    with open_regular(path, error, what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise error(f"{path}: {size} bytes, more than the {max_bytes} a {what} may have",
                        "too_large")
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise error(f"{path}: cannot read: {exc}", "read") from None
    if len(data) > max_bytes:  # grew while we read it
        raise error(f"{path}: more than the {max_bytes} bytes a {what} may have", "too_large")
    return data


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


# ---------------------------------------------------------------------- outputs
def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Both paths name one existing file (device and inode, through symlinks)."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def check_output(path: str | os.PathLike | None, inputs: Iterable[str | os.PathLike | None] = (),
                 error: ErrorFactory = _default_error, what: str = "output") -> Path:
    """Refuse, before any work, an output path that cannot become a regular file or that is
    one of `inputs`: `output_path` (empty, a directory, a device or FIFO, a parent that is not
    a directory, a name too long) or `output_is_input`."""
    if path is None or str(path) == "":
        raise error(f"the {what} path is empty", "output_path")
    text = str(path)
    if "\0" in text:
        raise error(f"the {what} path {text!r} holds a NUL", "output_path")
    p = Path(text)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:  # ENOTDIR (a parent is a file), ENAMETOOLONG, ELOOP, EACCES
        raise error(f"{what} {p}: unusable path: {exc.strerror}", "output_path") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {p}: is {_kind(st.st_mode)}; it must be a regular file",
                    "output_path")
    for source in inputs:
        if source is not None and same_file(p, source):
            raise error(f"{what} {p} is the input {source}: writing it would destroy the input",
                        "output_is_input")
    parent = p.parent
    try:
        pst = os.stat(parent)
    except FileNotFoundError:
        pst = None  # created when written
    except OSError as exc:
        raise error(f"{what} {p}: unusable directory {parent}: {exc.strerror}",
                    "output_path") from None
    if pst is not None and not stat.S_ISDIR(pst.st_mode):
        raise error(f"{what} {p}: {parent} is not a directory", "output_path")
    try:
        limit = os.pathconf(parent if pst is not None else ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    if len(os.fsencode(p.name)) + len(".tmpXXXXXXXX.") > limit:
        raise error(f"{what} {p}: the file name is longer than this file system's {limit} "
                    "bytes allow", "output_path")
    return p


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, error: ErrorFactory = _default_error,
                  what: str = "output", mode: str = "wb") -> Iterator[IO]:
    """A file to write `path`'s new contents to: a unique temporary name in the same directory,
    renamed over `path` when the block ends without an exception (removed otherwise). An OS
    error (a full disk, no permission) becomes `error(..., "write")`."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name[:64]}.", suffix=".tmp")
    except OSError as exc:
        raise error(f"cannot write the {what} {p}: {exc.strerror or exc}", "write") from None
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp's 0600 would hide a shared output
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
        os.replace(tmp, p)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise error(f"cannot write the {what} {p}: {exc.strerror or exc}", "write") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def temporary_sibling(path: str | os.PathLike) -> Path:
    """A new, empty, uniquely named file in `path`'s directory (for a writer that renames it
    into place itself, e.g. one handing the name to a library)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name[:64]}.", suffix=".tmp")
    os.fchmod(fd, 0o666 & ~_UMASK)
    os.close(fd)
    return Path(tmp)
