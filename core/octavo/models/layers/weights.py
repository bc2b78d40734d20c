"""Copying checkpoint tensors into parameters, one shard at a time.

Every parameter may carry a ``weight_loader(param, loaded, shard_id=None)`` attribute: the
model's ``load_weights`` calls it for each HF tensor that maps onto the parameter. Layers
whose parameters are fused (QKV, gate/up, stacked experts) or sharded across tensor-parallel
ranks set their own; plain parameters use :func:`default_weight_loader`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class WeightShapeError(ValueError):
    """A checkpoint tensor does not have the shape the model expects for it."""


def check_shape(loaded: torch.Tensor, expected: Sequence[int]) -> None:
    if tuple(loaded.shape) != tuple(expected):
        raise WeightShapeError(f"shape mismatch: the model expects {tuple(expected)}, "
                               f"the checkpoint has {tuple(loaded.shape)}")


def copy_shard(
    dst: torch.Tensor, loaded: torch.Tensor, dim: int = 0, tp_rank: int = 0, tp_size: int = 1
) -> None:
    """Copy this rank's slice of ``loaded`` along ``dim`` into ``dst``.

    ``loaded`` is the whole (unsharded) checkpoint tensor: ``tp_size`` times ``dst`` along
    ``dim``. With ``tp_size == 1`` this is a checked copy.
    """
    expected = list(dst.shape)
    expected[dim] *= tp_size
    check_shape(loaded, expected)
    size = dst.shape[dim]
    dst.copy_(loaded.narrow(dim, tp_rank * size, size))


def default_weight_loader(
    param: torch.Tensor, loaded: torch.Tensor, shard_id: object = None
) -> None:
    """Whole-tensor copy for parameters that are neither fused nor sharded."""
    copy_shard(param.data, loaded)


def new_parameter(*shape: int, weight_loader=default_weight_loader) -> torch.nn.Parameter:
    """An uninitialised, frozen parameter (inference only) in torch's default dtype/device;
    the checkpoint fills it."""
    param = torch.nn.Parameter(torch.empty(*shape), requires_grad=False)
    param.weight_loader = weight_loader  # type: ignore[attr-defined]
    return param
