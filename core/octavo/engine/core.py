"""``EngineCore``: the inner loop - schedule, execute, update - around one model.

It knows nothing of text: requests arrive as token ids with sampling params, and each
``step()`` returns per-request ``EngineCoreOutput``s (new token ids, finish reasons). The
offline ``LLM`` drives it in-process; the server drives it in its own process.

A step that raises (in the scheduler, the model or the sampler) aborts the requests it
held through the scheduler's normal finish path, which frees their KV blocks and tells the
workers to drop them in the next step, so scheduler and workers agree again and the other
requests run on; ``StepError`` then says which requests were lost. Whether to go on is the
caller's decision.

With pipeline micro-batches (``executor.max_concurrent_batches`` > 1) ``step()`` keeps up
to that many steps in flight (``octavo.engine.batch_queue``): it sends a new step while
there is room and applies the oldest step's output otherwise, so a call may return no
outputs while the pipeline fills. A step that fails (or a schedule that fails) aborts the
requests of every step in flight, whose futures are all waited for first.

Async scheduling (``--async-scheduling``) runs through the same queue with two steps in
flight: the executor runs step N (on a thread, or in the worker processes) while this
schedules step N+1 - its requests' tokens from step N are placeholders the worker fills
in (``octavo.sched.in_flight``) - and the caller processes step N-1's outputs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future

from octavo.config import ConfigError, EngineConfig
from octavo.config.engine import async_scheduling_refusals
from octavo.engine.batch_queue import BatchQueue, InFlightStep
from octavo.engine.components import build_scheduler
from octavo.engine.errors import StepError
from octavo.engine.heap import freeze_startup_heap
from octavo.engine.runner_setup import setup_runner
from octavo.executor.base import WorkerDiedError
from octavo.executor.select import make_executor
from octavo.kv.cache_spec import (
    FullAttentionSpec,
    KVCacheGroup,
    SSMStateSpec,
    describe_groups,
    is_hybrid,
    kv_cache_groups,
    layers_per_group,
    max_blocks_per_request,
    ssm_state_spec,
)
from octavo.models.config import model_eos_token_ids
from octavo.models.loader import ModelFiles
from octavo.outputs import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from octavo.platforms import Platform
from octavo.plugins import get_registries
from octavo.request import Request, RequestStatus
from octavo.sched.structured_outputs import StructuredOutputManager

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, config: EngineConfig, platform: type[Platform], files: ModelFiles,
                 max_model_len: int,
                 on_executor_failure: Callable[[str], None] | None = None) -> None:
        """``on_executor_failure``: called (from a monitor thread) when a worker process
        dies, with the reason; the engine cannot step again."""
        self.config = config
        self.platform = platform
        config.model.max_model_len = max_model_len
        encoder = setup_runner(config, files, max_model_len, platform)
        registries = get_registries()
        self.executor = make_executor(config, platform, files, on_executor_failure)
        try:
            layer_specs = self.executor.collective_rpc("get_kv_cache_spec")[0]
            kv_groups = kv_cache_groups(layer_specs)
            check_kv_groups_supported(config, kv_groups)
            ssm_state = ssm_state_spec(layer_specs)
            if ssm_state is not None:
                check_ssm_state_supported(config, ssm_state)
            num_blocks = self.executor.determine_num_blocks()
            check_kv_fits(num_blocks, config.cache.block_size, max_model_len,
                          kv_groups, config.scheduler.max_num_batched_tokens)
            check_steps_in_flight_supported(config, self.executor.max_concurrent_batches)
            self.executor.initialize_kv_cache(num_blocks)
        except BaseException:
            self.executor.shutdown()
            raise
        config.cache.num_gpu_blocks = num_blocks
        self.structured_output = StructuredOutputManager(
            files.tokenizer, int(files.hf_config["vocab_size"]),
            model_eos_token_ids(files, config.model.generation_config),
            config.structured_outputs)
        self.scheduler = build_scheduler(config, registries, self.structured_output,
                                         kv_groups, ssm_state)
        # Steps in flight (pipeline micro-batches, async scheduling); None: one at a time.
        self.batch_queue: BatchQueue | None = None
        if self.executor.max_concurrent_batches > 1:
            if not self.scheduler.supports_steps_in_flight:
                self.executor.shutdown()
                raise ConfigError(f"--scheduler-cls {config.scheduler.scheduler_cls} does "
                                  "not support steps in flight (pipeline micro-batches, "
                                  "async scheduling): pass --no-enable-pipeline-micro-batching "
                                  "and --no-async-scheduling")
            self.batch_queue = BatchQueue(self.executor.max_concurrent_batches)
            if not config.scheduler.async_scheduling:  # micro-batches share requests out
                self.scheduler.steps_in_flight = self.batch_queue.size
                logger.info("pipeline micro-batches: up to %d steps in flight",
                            self.batch_queue.size)
        log_async_scheduling(config)
        if encoder:
            logger.info("no KV cache (an encoder); the scheduler counts a step's tokens in %d "
                        "blocks of %d", num_blocks, config.cache.block_size)
        else:
            log_kv_cache(num_blocks, config.cache.block_size, max_model_len, kv_groups)
        if ssm_state is not None:
            logger.info("%s: a pool of %d state slots (max_num_seqs)", ssm_state.describe(),
                        config.scheduler.max_num_seqs)
        self.num_blocks = num_blocks
        # Every unfinished request: what a step whose plan failed half-made may have touched.
        self._request_ids: set[str] = set()
        # Steps whose output was applied: with steps in flight a ``step()`` call may only
        # send one, which says nothing of whether steps succeed (``EngineCoreProc``).
        self.steps_applied = 0
        freeze_startup_heap()

    def add_request(self, request: Request) -> None:
        """Take a request in; ``ValueError`` when the platform refuses it (the front end
        normally refused it already: this holds for a front end without the platform's
        plugin), so that no step ever holds a request its worker cannot run."""
        self.platform.validate_request(request)
        self.scheduler.add_request(request)
        self._request_ids.add(request.request_id)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
        self._request_ids.difference_update(request_ids)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self.batch_queue)

    def shutdown(self) -> None:
        """Stop the workers (worker processes, with the ``mp`` executor)."""
        self.executor.shutdown()

    def reset_prefix_cache(self) -> None:
        """Forget every cached block not held by a request (e.g. after new weights)."""
        self.scheduler.reset_prefix_cache()

    def step(self) -> list[EngineCoreOutput]:
        """Schedule, execute, update; raises ``StepError`` (from the cause) once the
        requests of a step that failed are aborted."""
        if self.batch_queue is not None:
            return self.step_with_batch_queue(self.batch_queue)
        try:
            scheduler_output = self.scheduler.schedule()
        except Exception as exc:  # the plan may have changed any request's state
            raise self._abort_step(sorted(self._request_ids), exc) from exc
        try:
            runner_output = self.executor.execute_model(scheduler_output)
            outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        except WorkerDiedError:
            raise  # not this step's fault: no step can run any more
        except Exception as exc:
            raise self._abort_step(list(scheduler_output.num_scheduled_tokens), exc,
                                   [scheduler_output]) from exc
        self._request_ids.difference_update(out.request_id for out in outputs if out.finished)
        self.steps_applied += 1
        return outputs

    def step_with_batch_queue(self, queue: BatchQueue) -> list[EngineCoreOutput]:
        """Send a new step while the queue has room and the oldest step is still running;
        otherwise apply the oldest step's output (vLLM's ``step_with_batch_queue``)."""
        if not queue.full:
            try:
                scheduler_output = self.scheduler.schedule()
            except Exception as exc:
                raise self._fail_in_flight(queue, sorted(self._request_ids), exc) from exc
            if self._worth_sending(scheduler_output, queue):
                queue.push(InFlightStep(scheduler_output, self._submit(scheduler_output)))
                if not queue.full and not queue.oldest_done():
                    return []
        step = queue.pop_oldest()
        try:
            outputs = self.scheduler.update_from_output(step.scheduler_output,
                                                        step.future.result())
        except WorkerDiedError:
            queue.drain()
            raise
        except Exception as exc:
            failed = list(step.scheduler_output.num_scheduled_tokens)
            raise self._fail_in_flight(queue, failed, exc, [step.scheduler_output]) from exc
        self._request_ids.difference_update(out.request_id for out in outputs if out.finished)
        self.steps_applied += 1
        return outputs

    def _submit(self, scheduler_output: SchedulerOutput) -> Future[ModelRunnerOutput]:
        """The executor's future for the step; a step it could not even send fails there."""
        try:
            return self.executor.submit_step(scheduler_output)
        except Exception as exc:  # WorkerDiedError included: result() raises it again
            future: Future[ModelRunnerOutput] = Future()
            future.set_exception(exc)
            return future

    @staticmethod
    def _worth_sending(scheduler_output: SchedulerOutput, queue: BatchQueue) -> bool:
        """An empty step is sent only when nothing is in flight (as one step at a time
        does) or when it tells the workers of finished requests; otherwise the oldest
        step's output is what the engine waits for."""
        return bool(scheduler_output.total_num_scheduled_tokens
                    or scheduler_output.finished_req_ids or not queue)

    def _fail_in_flight(self, queue: BatchQueue, request_ids: list[str], cause: Exception,
                        failed: list[SchedulerOutput] | None = None) -> StepError:
        """A failure with steps in flight fails their requests too: wait for every step's
        answer, then abort the requests of ``request_ids`` and of every step in flight."""
        in_flight = queue.request_ids()
        steps = [*(failed or []), *queue.drain()]
        return self._abort_step(list(dict.fromkeys([*request_ids, *in_flight])), cause, steps)

    def _abort_step(self, request_ids: list[str], cause: Exception,
                    steps: list[SchedulerOutput] | None = None) -> StepError:
        """Abort the failed step's requests. Every one of them is reported, even those the
        scheduler finished before the failure: their final outputs were lost with it; the
        scheduler forgets the failed ``steps`` (no output of theirs will be applied). If
        the abort fails too, the scheduler's state is broken and that error propagates."""
        self.abort_requests(request_ids)
        self.scheduler.forget_steps(steps or [])
        return StepError(request_ids, cause)


def log_async_scheduling(config: EngineConfig) -> None:
    """Say at start whether async scheduling runs, and why not where it does not."""
    scheduler = config.scheduler
    if scheduler.async_scheduling:
        logger.info("async scheduling: on, the next step is planned while one runs")
        return
    if not scheduler.async_scheduling_by_default:
        why = "--no-async-scheduling"
    elif config.model.runner == "pooling":
        why = "the pooling runner"
    elif scheduler.scheduler_cls != "default":
        why = f"--scheduler-cls {scheduler.scheduler_cls}: turn it on with --async-scheduling"
    else:
        why = async_scheduling_refusals(config)[0]
    logger.info("async scheduling: off (%s)", why)


def check_steps_in_flight_supported(config: EngineConfig, max_concurrent_batches: int) -> None:
    """Refuse, at start, what cannot run with several steps in flight rather than run it
    one step at a time unasked: drafts (speculative decoding) are proposed from the
    previous step's output, and a KV connector's loads and saves are planned step by step.
    (Async scheduling is checked with the config: its drafting requests wait for their
    step, ``octavo.sched.in_flight``.)"""
    if max_concurrent_batches == 1 or config.scheduler.async_scheduling:
        return
    used = [what for what in features_in_use(config) if "--kv-manager" not in what]
    if used:
        raise ConfigError(f"{used[0]} does not run with pipeline micro-batches ("
                          f"{max_concurrent_batches} steps in flight): "
                          "pass --no-enable-pipeline-micro-batching to run one step at a time")


def check_kv_groups_supported(config: EngineConfig, kv_groups: list[KVCacheGroup]) -> None:
    """Refuse what KV groups (sliding-window layers) do not work with yet: the draft and
    EAGLE caches and the KV connectors lay their data out by one block table, and a
    ``--kv-manager`` plugin knows nothing of groups."""
    if not is_hybrid(kv_groups):
        return
    used = features_in_use(config)
    if used:
        raise ConfigError(f"this model's sliding-window layers give it KV groups "
                          f"({describe_groups(kv_groups)}), which do not support {used[0]} "
                          "yet")


def features_in_use(config: EngineConfig) -> list[str]:
    """The features a KV layout other than one full-attention group (KV groups, an SSM
    state) does not support, that ``config`` turns on."""
    features = [
        ("speculative decoding (--speculative-config)", config.speculative is not None),
        ("a KV connector (--kv-transfer-config)", config.kv_transfer is not None),
        (f"--kv-manager {config.scheduler.kv_manager}", config.scheduler.kv_manager != "default"),
    ]
    return [what for what, used in features if used]


def check_ssm_state_supported(config: EngineConfig, ssm_state: SSMStateSpec) -> None:
    """Refuse what a per-request SSM state does not work with: drafts (a rejected draft's
    tokens would stay in the state), KV connectors (they move KV blocks, not states), a
    ``--kv-manager`` plugin (it keeps no state slots). Prefix caching, which would need the
    state at each block boundary, is turned off, with the reason logged."""
    used = features_in_use(config)
    if used:
        raise ConfigError(f"this model's SSM layers ({ssm_state.describe()}) keep a state "
                          f"per request, which does not support {used[0]}")
    if config.cache.enable_prefix_caching:
        logger.info("prefix caching is off: this model's SSM layers (%s) keep one state per "
                    "request, not one per block, so a cached prefix's state cannot be "
                    "resumed", ssm_state.describe())
        config.cache.enable_prefix_caching = False


def log_kv_cache(num_blocks: int, block_size: int, max_model_len: int,
                 kv_groups: list[KVCacheGroup]) -> None:
    """The cache's size at start-up; with KV groups, the groups too, and the tokens of
    context the full-attention groups can hold (each needs a block per ``block_size``
    tokens; sliding-window groups only their windows)."""
    if not is_hybrid(kv_groups):
        block_tokens = num_blocks * block_size
        logger.info("KV cache: %d blocks of %d tokens (%d tokens); max concurrency at "
                    "max_model_len=%d: %.2fx", num_blocks, block_size,
                    block_tokens, max_model_len, block_tokens / max_model_len)
        return
    num_full = sum(1 for group in kv_groups if isinstance(group.spec, FullAttentionSpec))
    held = (f"{(num_blocks - 1) * block_size // num_full} tokens of full-attention context"
            if num_full else "only each request's windows")
    logger.info("KV cache: %d KV groups (%s); %d blocks of %d tokens, each a page of %d "
                "layers; the cache holds %s", len(kv_groups), describe_groups(kv_groups),
                num_blocks, block_size, layers_per_group(kv_groups), held)


def check_kv_fits(num_blocks: int, block_size: int, max_model_len: int,
                  kv_groups: list[KVCacheGroup] | None = None,
                  max_chunk: int | None = None) -> None:
    """One request of ``max_model_len`` tokens must fit the cache: otherwise it could never
    run, even with every other request preempted, and would wait or be preempted forever.
    With KV groups it holds blocks in every group (and the null block is not handed out)."""
    needed_blocks = -(-max_model_len // block_size)
    if kv_groups and is_hybrid(kv_groups):
        needed_blocks = 1 + max_blocks_per_request(kv_groups, max_model_len, block_size,
                                                   max_chunk or max_model_len)
    if num_blocks < needed_blocks:
        raise ConfigError(
            f"the KV cache has {num_blocks} blocks of {block_size} tokens "
            f"({num_blocks * block_size} tokens), but one request of max_model_len "
            f"({max_model_len}) tokens needs {needed_blocks} blocks: raise --kv-cache-memory "
            "or lower --max-model-len")
