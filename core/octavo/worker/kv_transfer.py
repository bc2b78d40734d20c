"""``WorkerKVTransfer``: calls the worker side of a connector around one step's forward pass.

Per-layer calls (``wait_for_layer_load`` before a layer, ``save_kv_layer`` after it) are
PyTorch forward hooks on the model's decoder layers, registered only when a connector is
configured - an engine without one runs the very same forward with no hook at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import torch
from torch import nn

from octavo.kv_transfer.base import KVConnector
from octavo.outputs import KVConnectorOutput, ModelRunnerOutput, SchedulerOutput


class WorkerKVTransfer:
    def __init__(self, connector: KVConnector, model: nn.Module,
                 kv_caches: list[torch.Tensor]) -> None:
        self.connector = connector
        self.kv_caches = kv_caches
        connector.register_kv_caches(kv_caches)
        for index, layer in enumerate(decoder_layers(model, len(kv_caches))):
            layer.register_forward_pre_hook(self._before_layer(index))
            layer.register_forward_hook(self._after_layer(index))

    def execute(self, scheduler_output: SchedulerOutput,
                run_step: Callable[[SchedulerOutput], ModelRunnerOutput]) -> ModelRunnerOutput:
        """Loads, the step (``run_step``, with the per-layer hooks), saves, the report."""
        self.connector.bind_connector_metadata(self._metadata(scheduler_output))
        self.connector.start_load_kv()
        output = run_step(scheduler_output)
        self.connector.wait_for_save()
        sending, recving = self.connector.get_finished(scheduler_output.finished_req_ids)
        output.kv_connector_output = KVConnectorOutput(
            finished_sending=sending, finished_recving=recving,
            failed_recving=self.connector.get_failed_loads())
        return output

    def _metadata(self, scheduler_output: SchedulerOutput) -> Any:
        """The step's metadata as the connector built it: a worker process receives it
        msgpack-decoded into plain dicts and lists, converted back here."""
        metadata = scheduler_output.kv_connector_metadata
        metadata_type = self.connector.metadata_type
        if metadata_type is None or isinstance(metadata, metadata_type):
            return metadata
        return msgspec.convert(metadata, metadata_type)

    def _before_layer(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            self.connector.wait_for_layer_load(index)
        return hook

    def _after_layer(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            # Decoder layers take (..., kv_cache, attn_metadata) last.
            self.connector.save_kv_layer(index, self.kv_caches[index], args[-1])
        return hook


def decoder_layers(model: nn.Module, num_kv_caches: int) -> nn.ModuleList:
    """The model's attention layers in cache order (``model.model.layers``, as every
    Llama-family model and HF's convention has them)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) != num_kv_caches:
        raise TypeError(f"{type(model).__name__} has no model.layers list; KV connectors "
                        "need one decoder layer per KV-cache tensor")
    return layers
