"""``Executor``: how the engine core reaches its workers, wherever they run.

The core asks the same four things of every executor: run a method on every worker
(``collective_rpc``), run one step (``execute_model``: the scheduler output to every
worker, the output rank's answer back; ``submit_step``: the same without waiting, as a
future, vLLM's ``execute_model(..., non_block=True)``), say whether the workers are alive
(``check_health``) and stop them (``shutdown``). ``uni`` holds its one worker in the
core's process; ``mp`` runs a process per rank (``octavo.executor.multiproc``), ``ray`` an
actor per rank on a Ray cluster (``octavo.executor.ray_executor``); what those two share is
``octavo.executor.ranks``.

``max_concurrent_batches`` is how many steps the engine core may keep in flight (vLLM's
name): 1 for an executor whose ``submit_step`` runs the step before it returns; the ``mp``
executor's pipeline stages each work on another step, so it takes one per stage.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import Any

from octavo.config import EngineConfig
from octavo.models.loader import ModelFiles
from octavo.outputs import ModelRunnerOutput, SchedulerOutput
from octavo.platforms import Platform


class WorkerDiedError(RuntimeError):
    """A worker process is gone (or its answer can no longer come): the engine cannot
    run another step, unlike a step that failed and was answered with the error."""


class WorkerCallError(RuntimeError):
    """A worker raised while running a call; the message holds its error. The engine's
    step error: the step's requests fail, the workers keep serving."""


class Executor(ABC):
    def __init__(self, config: EngineConfig, platform: type[Platform],
                 files: ModelFiles) -> None:
        """Start the workers and load the model in each (``files`` were loaded in the
        core process: ``uni`` uses them, worker processes load their own)."""
        self.config = config
        self.platform = platform

    @abstractmethod
    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        """``worker.<method>(*args)`` on every worker; their results in rank order."""

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """One step on every worker; the output rank's result."""

    @property
    def max_concurrent_batches(self) -> int:
        """Steps the engine core may keep in flight at once (see ``submit_step``)."""
        return 1

    def submit_step(self, scheduler_output: SchedulerOutput) -> Future[ModelRunnerOutput]:
        """Start one step and return its output rank's result as a future; steps submitted
        one after another resolve in that order. Here the step runs before this returns
        (its error goes into the future), which is all one step in flight needs."""
        future: Future[ModelRunnerOutput] = Future()
        try:
            future.set_result(self.execute_model(scheduler_output))
        except Exception as exc:
            future.set_exception(exc)
        return future

    @abstractmethod
    def check_health(self) -> None:
        """Raise ``WorkerDiedError`` when a worker is gone."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the workers and release what they share; safe to call twice."""

    def determine_num_blocks(self) -> int:
        """KV blocks every worker can hold (each holds its shard of every block)."""
        return min(self.collective_rpc("determine_num_blocks"))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.collective_rpc("initialize_kv_cache", (num_blocks,))

