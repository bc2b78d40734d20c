"""Where Octavo keeps files: between runs, one user cache folder, ``$OCTAVO_CACHE_DIR`` or
the platform's (``~/.cache/octavo`` on Linux), which holds the GGUF conversion cache and the
CPU kernels' compiled library; for one run, private directories for the ``ipc://`` sockets
between its processes (``make_socket_dir``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs

CACHE_DIR_ENV = "OCTAVO_CACHE_DIR"
SOCKET_DIR_PREFIX = "octavo-"
# A Unix socket path must fit sockaddr_un.sun_path: 108 bytes with the terminating NUL.
MAX_SOCKET_PATH = 107
# The longest socket name a caller puts in the directory ("output", "worker-7-reply", ...).
MAX_SOCKET_NAME = 24


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV) or platformdirs.user_cache_dir("octavo"))


def make_socket_dir() -> Path:
    """A fresh directory of mode 0700 whose socket paths (names up to ``MAX_SOCKET_NAME``)
    fit ``MAX_SOCKET_PATH``: under ``$XDG_RUNTIME_DIR`` (per-user, on tmpfs) when set and
    usable, else the temp dir. Only this user can reach the sockets in it."""
    # mkdtemp appends 8 random characters to the prefix.
    room = len(SOCKET_DIR_PREFIX) + 8 + 1 + MAX_SOCKET_NAME
    for base in _socket_dir_bases():
        if len(os.fsencode(base)) + 1 + room > MAX_SOCKET_PATH:
            continue
        try:
            directory = tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX, dir=base)
        except OSError:
            continue
        os.chmod(directory, 0o700)  # mkdtemp's mode, whatever the umask
        return Path(directory)
    raise OSError("no directory for the engine's sockets: $XDG_RUNTIME_DIR, the temp dir "
                  f"and /tmp are unusable or too long for a {MAX_SOCKET_PATH}-byte socket path")


def _socket_dir_bases() -> list[str]:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return [base for base in (runtime, tempfile.gettempdir(), "/tmp") if base]
