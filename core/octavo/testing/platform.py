"""``PlatformContract``: a platform class's availability, identity, worker and memory contract
(``octavo.plugin_api.Platform``), on machines with its hardware and without.

A plugin runs it by subclassing it in its own tests::

    class TestMyPlatform(PlatformContract):
        platform = MyPlatform

Where the platform is not available, the checks that need its hardware (memory, preparing a
model) skip with the reason ``check_available`` gave; the rest - that it says so without
raising, and names a worker and an attention backend that exist - hold everywhere.
"""

from __future__ import annotations

import importlib
from typing import ClassVar

import pytest
import torch
from torch import nn

from octavo.plugin_api import (
    Availability,
    LlamaMLP,
    Platform,
    RMSNorm,
    WorkerInterface,
    get_registries,
)
from octavo.testing.contract import SeededContract, Verdict

# Largest relative change of a small model's outputs that prepare_model may cause (fused
# kernels round differently), by dtype.
PREPARE_RTOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 4e-2}
AVAILABILITY = "check_available returns an Availability and never raises"


class PlatformContract(SeededContract):
    """Subclass it and set ``platform``."""

    contract_kind = "platform"
    platform: ClassVar[type[Platform]]
    # dtypes prepare_model is tried with (where available); None: the platform's default.
    model_dtypes: ClassVar[tuple[str, ...] | None] = None

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "model_dtype" in metafunc.fixturenames:
            metafunc.parametrize("model_dtype",
                                 self.model_dtypes or (self.platform.default_dtype,))

    def test_check_available_never_raises(self, verdict: Verdict) -> None:
        answers = [self._availability(verdict) for _ in range(3)]
        first = answers[0]
        verdict.check(isinstance(first.available, bool) and isinstance(first.reason, str)
                      and bool(first.reason.strip()), AVAILABILITY,
                      f"got {first!r}: available must be a bool and reason say what was found "
                      "or looked for")
        verdict.check(all(a == first for a in answers), AVAILABILITY,
                      f"three calls in a row answered {answers}")
        verdict.check(self.platform.is_available() == first.available, AVAILABILITY,
                      f"is_available() is {self.platform.is_available()} but "
                      f"check_available() says {first!r}")

    def test_identity(self, verdict: Verdict) -> None:
        platform, contract = self.platform, "name, device type, dtype and backends are set"
        for attr in ("name", "device_type", "dist_backend", "attention_backend", "distribution"):
            value = getattr(platform, attr, None)
            verdict.check(isinstance(value, str) and bool(value) and value == value.strip(),
                          contract, f"{attr} is {value!r}: a non-empty name")
        verdict.check(platform.name.replace("_", "").replace("-", "").isalnum(), contract,
                      f"name {platform.name!r} is what --backend takes: letters, digits, - _")
        dtype = getattr(torch, platform.default_dtype, None)
        verdict.check(isinstance(dtype, torch.dtype) and dtype.is_floating_point, contract,
                      f"default_dtype {platform.default_dtype!r} is not a torch float dtype")
        verdict.check(isinstance(platform.priority, int), contract,
                      f"priority is {platform.priority!r}")
        verdict.check(isinstance(platform.missing_kernels, str), contract,
                      f"missing_kernels is {platform.missing_kernels!r}: '' or why not yet")

    def test_registered_under_its_name(self, verdict: Verdict) -> None:
        registry = get_registries().platforms
        name = self.platform.name
        found = registry.get(name) if name in registry else None
        verdict.check(found is self.platform, "registered under its name",
                      f"the platform registry holds {found!r} under {name!r} (registered: "
                      f"{registry.names()}); register it in octavo_register_platforms")

    def test_attention_backend_is_registered(self, verdict: Verdict) -> None:
        if self.platform.missing_kernels:
            pytest.skip(f"{self.platform.name} has no kernels yet: "
                        f"{self.platform.missing_kernels}")
        registry = get_registries().attention_backends
        verdict.check(self.platform.attention_backend in registry,
                      "attention_backend names a registered attention backend",
                      f"{self.platform.attention_backend!r} is not among {registry.names()}")

    def test_worker_cls_imports_a_worker(self, verdict: Verdict) -> None:
        contract = "worker_cls is the qualified name of a WorkerInterface subclass"
        qualname = self.platform.worker_cls
        verdict.check(isinstance(qualname, str) and "." in qualname.strip("."), contract,
                      f"worker_cls is {qualname!r}: package.module.ClassName")
        module_name, _, attr = qualname.rpartition(".")
        try:
            worker = getattr(importlib.import_module(module_name), attr)
        except Exception as exc:
            verdict.broken(contract, f"importing {qualname!r} raised {exc!r}", traceback=True)
        verdict.check(isinstance(worker, type) and issubclass(worker, WorkerInterface), contract,
                      f"{qualname!r} is {worker!r}, not a subclass of "
                      "octavo.plugin_api.WorkerInterface (the torch Worker is one)")

    def test_memory(self, verdict: Verdict) -> None:
        self._require_available(verdict)
        total, free = self.platform.total_memory(), self.platform.free_memory()
        verdict.check(all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                          for v in (total, free)) and free <= total,
                      "total_memory and free_memory are byte counts, free <= total",
                      f"total_memory() = {total!r}, free_memory() = {free!r}")

    def test_prepare_model_keeps_outputs(self, model_dtype: str, verdict: Verdict) -> None:
        self._require_available(verdict)
        try:
            device = torch.device(self.platform.device_type)
        except RuntimeError:
            pytest.skip(f"device type {self.platform.device_type!r} is not a torch device")
        dtype = getattr(torch, model_dtype)
        contract = "prepare_model returns a count and keeps the model's outputs"
        gen = torch.Generator().manual_seed(verdict.seed)
        model = _small_model(gen).to(device, dtype)
        x = torch.randn(7, HIDDEN, generator=gen).to(device, dtype)
        with torch.inference_mode():
            before = model(x).float()
        with torch.no_grad():  # as the worker calls it, after loading the weights
            changed = self.platform.prepare_model(model, dtype)
        with torch.inference_mode():
            after = model(x).float()
        verdict.check(isinstance(changed, int) and not isinstance(changed, bool) and changed >= 0,
                      contract, f"prepare_model returned {changed!r}, not a number of layers")
        error = float((after - before).abs().max() / before.abs().max())
        verdict.check(error <= PREPARE_RTOL.get(dtype, 1e-4), contract,
                      f"in {model_dtype}, the outputs of an RMSNorm + LlamaMLP block moved by "
                      f"{error:.3g} of their largest value after prepare_model ({changed} "
                      "layers changed)")

    def _availability(self, verdict: Verdict) -> Availability:
        try:
            availability = self.platform.check_available()
        except Exception as exc:
            verdict.broken(AVAILABILITY, f"check_available() raised {exc!r}", traceback=True)
        verdict.check(isinstance(availability, Availability), AVAILABILITY,
                      f"check_available() returned {availability!r}")
        return availability

    def _require_available(self, verdict: Verdict) -> None:
        availability = self._availability(verdict)
        if not availability.available:
            pytest.skip(f"{self.platform.name} is not available here: {availability.reason}")


HIDDEN = 64


class _SmallModel(nn.Module):
    """The layers platforms specialise: an RMSNorm and a gated MLP (fused linear layers,
    SiluAndMul), on 2-D activations as in a decoder layer."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = RMSNorm(HIDDEN, 1e-5)
        self.mlp = LlamaMLP(HIDDEN, 2 * HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.norm(x))


def _small_model(gen: torch.Generator) -> _SmallModel:
    model = _SmallModel()
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            param.copy_(1.0 + 0.2 * noise if name.startswith("norm") else 0.1 * noise)
    return model.eval()
