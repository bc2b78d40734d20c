"""Where Octavo keeps files: between runs, one user cache folder, ``$OCTAVO_CACHE_DIR`` or
the platform's (``~/.cache/octavo`` on Linux), which holds the GGUF conversion cache and the
CPU kernels' compiled library; for one run, private directories for the ``ipc://`` sockets
between its processes (``make_socket_dir``), named for the process that made them so that a
later run removes those whose maker died without cleaning up (a SIGKILL)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import platformdirs

CACHE_DIR_ENV = "OCTAVO_CACHE_DIR"
SOCKET_DIR_PREFIX = "octavo-"
# A socket directory's name: the prefix, the PID namespace and the pid of the process that
# made it, mkdtemp's suffix. A pid names a process only within its namespace: a maker in
# another one (a container, `unshare --pid`) sharing the temp dir is never judged by it.
_SOCKET_DIR_NAME = re.compile(re.escape(SOCKET_DIR_PREFIX)
                              + r"([1-9]\d{0,19})-([1-9]\d{0,9})-[^/]+")
# A Unix socket path must fit sockaddr_un.sun_path: 108 bytes with the terminating NUL.
MAX_SOCKET_PATH = 107
# The longest socket name a caller puts in the directory ("output", "worker-7-reply", ...).
MAX_SOCKET_NAME = 24


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV) or platformdirs.user_cache_dir("octavo"))


def make_socket_dir() -> Path:
    """A fresh directory of mode 0700 whose socket paths (names up to ``MAX_SOCKET_NAME``)
    fit ``MAX_SOCKET_PATH``: under ``$XDG_RUNTIME_DIR`` (per-user, on tmpfs) when set and
    usable, else the temp dir. Only this user can reach the sockets in it. Stale ones of
    this user beside it (their maker's pid is gone) are removed first."""
    prefix = f"{SOCKET_DIR_PREFIX}{pid_namespace()}-{os.getpid()}-"
    room = len(prefix) + 8 + 1 + MAX_SOCKET_NAME  # mkdtemp appends 8 random characters
    for base in _socket_dir_bases():
        if len(os.fsencode(base)) + 1 + room > MAX_SOCKET_PATH:
            continue
        remove_stale_socket_dirs(Path(base))
        try:
            directory = tempfile.mkdtemp(prefix=prefix, dir=base)
        except OSError:
            continue
        os.chmod(directory, 0o700)  # mkdtemp's mode, whatever the umask
        return Path(directory)
    raise OSError("no directory for the engine's sockets: $XDG_RUNTIME_DIR, the temp dir "
                  f"and /tmp are unusable or too long for a {MAX_SOCKET_PATH}-byte socket path")


def remove_stale_socket_dirs(base: Path) -> list[Path]:
    """Remove this user's socket directories in ``base`` whose maker is no longer running
    (a process killed before its cleanup ran leaves its directory behind); returns them.
    Another user's directories, another PID namespace's, and those of a pid that exists are
    left alone; so is everything where this process's namespace is unknown."""
    removed: list[Path] = []
    namespace = pid_namespace()
    if namespace == 0:
        return removed
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        match = _SOCKET_DIR_NAME.fullmatch(entry.name)
        try:
            if (match is None or int(match.group(1)) != namespace
                    or not entry.is_dir(follow_symlinks=False)
                    or entry.stat(follow_symlinks=False).st_uid != os.getuid()
                    or _pid_exists(int(match.group(2)))):
                continue
        except OSError:  # gone meanwhile
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def pid_namespace() -> int:
    """This process's PID namespace: the inode of ``/proc/self/ns/pid`` (0 where unknown)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _socket_dir_bases() -> list[str]:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return [base for base in (runtime, tempfile.gettempdir(), "/tmp") if base]
