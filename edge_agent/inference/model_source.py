"""Where `model.update` may read a model from, and how: the trust boundary of a remote command.

A command names a file; the daemon reads it only when it is a regular file directly inside an
allowed directory (`inference.update_dir`, or the service's own model cache), that directory is
owned by root (or by the service's user) and writable by no one else, the file is opened without
following a symlink, and its size (fstat, before reading) is under `inference.max_model_bytes`.
The bytes are hashed while they are read, in chunks. Nothing here puts a hash, a size or the
contents of a refused file into an error message: a command must not become a file-guessing
oracle or an existence probe beyond "not allowed".
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edge_agent.inference.model_card import CARD_MAX_BYTES, ModelCard, ModelError, card_path_for

CHUNK = 1 << 20
MAX_CARD_BYTES = CARD_MAX_BYTES


class SourceRefused(ValueError):
    """The uri names nothing model.update may read (the reply says why, never what it holds)."""


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A model file read for installation: its bytes, their sha256 and the card beside it."""

    path: Path
    data: bytes
    sha256: str
    card: ModelCard | None


def local_path(uri: str) -> Path:
    """An absolute path or a file:// URI on this machine (the daemon downloads nothing)."""
    from urllib.parse import unquote, urlsplit

    if uri.startswith("file://"):
        p = Path(unquote(urlsplit(uri).path))
    elif "://" in uri:
        raise SourceRefused(f"uri {uri!r}: only local files (an absolute path or file://) — "
                            "the daemon does not download; copy the model into "
                            "inference.update_dir first")
    else:
        p = Path(uri)
    if not p.is_absolute():
        raise SourceRefused(f"uri {uri!r}: give an absolute path inside inference.update_dir")
    if "\0" in str(p):
        raise SourceRefused("uri: NUL in the path")
    return p


def check_directory(d: Path) -> str | None:
    """Why `d` is not a trusted model directory (None: it is)."""
    try:
        st = os.stat(d)
    except OSError as e:
        return f"{d}: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{d} is not a directory"
    if st.st_uid not in (0, os.geteuid()):
        return f"{d} is owned by uid {st.st_uid}, not root (chown root:root {d})"
    mode = stat.S_IMODE(st.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{d} is writable by group or others (mode {mode:04o}; chmod go-w {d})"
    return None


def read_model(uri: str, allowed: Sequence[Path], max_bytes: int) -> ModelSource:
    """Read the model (and its card) `uri` names; SourceRefused or ModelError otherwise."""
    p = local_path(uri)
    parent = Path(os.path.normpath(p.parent))
    dirs = [Path(os.path.normpath(d)) for d in allowed]
    if parent not in dirs:
        where = " or ".join(str(d) for d in dirs) or "(none: set inference.update_dir)"
        raise SourceRefused(f"uri {uri!r}: model.update reads only files directly inside "
                            f"{where}")
    why = check_directory(parent)
    if why is not None:
        raise SourceRefused(f"the model directory is not trusted: {why}")
    dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        data, sha = _read_capped(dfd, p.name, max_bytes, "model")
        card_name = card_path_for(p).name
        card = None
        with contextlib.suppress(FileNotFoundError):
            raw, _ = _read_capped(dfd, card_name, MAX_CARD_BYTES, "card")
            card = ModelCard.parse(_json(raw, card_name))
    finally:
        os.close(dfd)
    return ModelSource(p, data, sha, card)


def _read_capped(dfd: int, name: str, max_bytes: int, what: str) -> tuple[bytes, str]:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dfd)
    except FileNotFoundError:
        if what == "card":
            raise
        raise SourceRefused(f"{name}: no such file") from None
    except OSError as e:  # ELOOP: a symlink
        reason = "is a symbolic link" if e.errno == errno.ELOOP else e.strerror
        raise SourceRefused(f"{what} {name}: {reason} (only regular files are read)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SourceRefused(f"{what} {name}: not a regular file")
        if st.st_size > max_bytes:
            raise SourceRefused(f"{what} {name}: larger than the limit of {max_bytes} bytes "
                                "(inference.max_model_bytes)")
        h = hashlib.sha256()
        parts: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, CHUNK)
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:  # it grew while we read it
                raise SourceRefused(f"{what} {name}: larger than the limit of {max_bytes} bytes")
            h.update(chunk)
            parts.append(chunk)
    finally:
        os.close(fd)
    return b"".join(parts), h.hexdigest()


def _json(raw: bytes, name: str) -> object:
    import json

    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ModelError(f"model card {name}: {e}") from None
