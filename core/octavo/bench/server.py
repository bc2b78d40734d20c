"""``octavo serve`` in a child process on 127.0.0.1, for benchmarks that need a fresh server
per setting (autotune) and for tests. The child is always stopped on exit, even when the
benchmark fails, and a server that dies at start-up is reported with the end of its log."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from types import TracebackType

from octavo.bench.serve import EndpointError
from octavo.net import free_port

HOST = "127.0.0.1"
POLL_S = 0.5
STOP_TIMEOUT_S = 30.0
LOG_TAIL_CHARS = 3000



class ServerProcess:
    """``with ServerProcess(["--model", path]) as server:`` - a ready server at
    ``server.base_url``. ``serve_args`` are ``octavo serve`` flags other than host and port."""

    def __init__(self, serve_args: list[str], startup_timeout_s: float = 300.0) -> None:
        self.serve_args = serve_args
        self.startup_timeout_s = startup_timeout_s
        self.port = free_port()
        self.base_url = f"http://{HOST}:{self.port}"
        self._log = tempfile.TemporaryFile("w+")
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> ServerProcess:
        command = [sys.executable, "-m", "octavo", "serve", "--host", HOST,
                   "--port", str(self.port), *self.serve_args]
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, text=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
        self._log.close()

    @property
    def pid(self) -> int:
        assert self._process is not None, "the server is started by entering the with block"
        return self._process.pid

    def log(self) -> str:
        """Everything the server printed so far."""
        self._log.flush()
        self._log.seek(0)
        return self._log.read()

    def stop(self) -> None:
        """SIGTERM (the server shuts down its engine process cleanly), SIGKILL if it hangs."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise EndpointError(f"octavo serve exited with code {self._process.returncode} "
                                    f"at start-up:\n{self.log()[-LOG_TAIL_CHARS:]}")
            try:
                with opener.open(f"{self.base_url}/health", timeout=POLL_S) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(POLL_S)
        raise EndpointError(f"octavo serve was not ready after {self.startup_timeout_s:.0f} s:\n"
                            f"{self.log()[-LOG_TAIL_CHARS:]}")
