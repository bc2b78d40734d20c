"""``shared_storage``: prompt KV as safetensors files under a directory every engine sees
(``{"connector": "shared_storage", "path": "/shared/kv"}``).

Layout: ``<path>/<prefix hash>/layer_NNN.safetensors`` plus an empty ``done`` file written
last. Each file is written to a temporary name and renamed into place, so a reader sees a
whole file or none.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from octavo.plugin_api import ConfigError
from octavo_connectors.prefix_store import BlobStore, PrefixStoreConnector


class DirectoryStore(BlobStore):
    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, name: str) -> Path:
        return self.root / f"{name}.safetensors" if "/layer_" in name else self.root / name

    def exists(self, name: str) -> bool:
        return self._path(name).exists()

    def put(self, name: str, data: bytes) -> None:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    def get(self, name: str) -> bytes:
        try:
            return self._path(name).read_bytes()
        except FileNotFoundError:
            raise KeyError(f"{self._path(name)} is missing") from None


class SharedStorageConnector(PrefixStoreConnector):
    def make_store(self) -> BlobStore:
        path = self.config.extra.get("path")
        if not isinstance(path, str) or not path:
            raise ConfigError('kv_transfer_config: the shared_storage connector needs "path", '
                              "the directory that holds the KV files")
        return DirectoryStore(Path(path))
