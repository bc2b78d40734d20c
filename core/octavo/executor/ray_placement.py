"""Where the ``ray`` executor's workers go: joining the Ray cluster, reserving one bundle
per rank, and reading back which node holds each bundle.

Octavo never starts a cluster of its own: ``ray.init`` joins the one ``RAY_ADDRESS`` names,
or the one ``ray start`` left on this machine. Every rank takes one whole unit of its
platform's Ray resource (a CPU, or a GPU), reserved together in one placement group with
the PACK strategy, so ranks share a node wherever the node has room and spread over nodes
only when they must.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from octavo.config import ConfigError
from octavo.platforms import Platform

logger = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_S = 60.0  # for a busy cluster to free the resources it has

NO_CLUSTER = ("{flag}='ray' places the {what} on a running Ray cluster, and none was "
              "found: start one with `ray start --head` (and `ray start --address HEAD:PORT` "
              "on the other nodes), or set RAY_ADDRESS to its address")

# A platform's torch device type -> the Ray resource one of its workers takes (AMD GPUs are
# torch's "cuda" too, and Ray's "GPU").
RAY_RESOURCES = {"cpu": "CPU", "cuda": "GPU"}


@dataclass(frozen=True)
class NodePlacement:
    """The Ray node one rank runs on."""

    node_id: str
    ip: str

    @property
    def is_loopback(self) -> bool:
        return ipaddress.ip_address(self.ip).is_loopback


def connect(flag: str = "distributed_executor_backend", what: str = "workers") -> bool:
    """Join the Ray cluster unless this process already has; True when it joined now (then
    it is the one to leave: ``ray.shutdown``). ``flag`` and ``what`` name, in the error when
    there is no cluster, the setting that wants Ray and what it places."""
    if ray.is_initialized():
        return False
    try:
        ray.init(address=os.environ.get("RAY_ADDRESS", "auto"))
    except ConnectionError as exc:
        raise ConfigError(NO_CLUSTER.format(flag=flag, what=what)) from exc
    return True


def ray_resource(platform: type[Platform]) -> str:
    try:
        return RAY_RESOURCES[platform.device_type]
    except KeyError:
        raise ConfigError(f"distributed_executor_backend='ray' places workers of the "
                          f"{', '.join(RAY_RESOURCES)} device types; the {platform.name} "
                          f"platform's is {platform.device_type!r}: use 'mp'") from None


def reserve(resource: str, count: int, size: int = 1, what: str | None = None,
            ) -> PlacementGroup:
    """``count`` bundles of ``size`` ``resource`` each (one per rank; one per engine, of
    its workers' share, for data-parallel engines), placed - or a ``ConfigError`` saying
    what the cluster has and what ``what`` (default: the engine's workers) need."""
    what = what or (f"the engine's tensor_parallel_size x sequence_parallel_size x "
                    f"pipeline_parallel_size = {count} workers")
    total = ray.cluster_resources().get(resource, 0.0)
    if total < count * size:
        raise ConfigError(
            f"the Ray cluster has {total:g} {resource} in all "
            f"({len(_alive_nodes())} node(s)), and {what} need {count * size} ({size} "
            "each): add nodes or lower the sizes")
    group = placement_group([{resource: size}] * count, strategy="PACK")
    if not group.wait(timeout_seconds=PLACEMENT_TIMEOUT_S):
        free = ray.available_resources().get(resource, 0.0)
        remove_placement_group(group)
        raise ConfigError(
            f"the Ray cluster could not place {what} ({size} {resource} each) within "
            f"{PLACEMENT_TIMEOUT_S:.0f} s: {free:g} of its {total:g} {resource} are free "
            "(`ray status` shows what holds the others)")
    return group


def placement_of(group: PlacementGroup) -> list[NodePlacement]:
    """The node of each bundle (of each rank), in bundle order."""
    ips = {node["NodeID"]: node["NodeManagerAddress"] for node in _alive_nodes()}
    bundles = placement_group_table(group)["bundles_to_node_id"]
    return [NodePlacement(node_id=bundles[i], ip=ips[bundles[i]]) for i in range(len(bundles))]


def _alive_nodes() -> list[dict[str, Any]]:
    return [node for node in ray.nodes() if node["Alive"]]


def in_bundle(group: PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    """The scheduling strategy that puts an actor in bundle ``index`` of ``group``."""
    return PlacementGroupSchedulingStrategy(placement_group=group,
                                            placement_group_bundle_index=index)


def release(group: PlacementGroup | None, joined: bool) -> None:
    """Give the reserved bundles back, and leave the cluster if ``connect`` joined it."""
    if group is not None:
        remove_placement_group(group)
    if joined:
        ray.shutdown()
