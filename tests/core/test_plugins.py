"""The plugin system through real entry points: installed distributions, fixture plugins
installed with pip into a throw-away folder, and the ``octavo`` CLI in subprocesses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from octavo.plugins import PluginHost, Registries, Registry, RegistryError
from octavo.plugins.manager import core_version_problem
from octavo.request import Request
from octavo.sampling_params import SamplingParams

from ..helpers import run_octavo

pytestmark = pytest.mark.needs_plugins

FIXTURES = Path(__file__).parent / "plugin_fixtures"
DISTRIBUTIONS = ["octavo", "octavo-triton", "octavo-cuda", "octavo-rocm", "octavo-tpu",
                 "octavo-neuron", "octavo-connectors", "octavo-spec-decode"]


@pytest.fixture(scope="session")
def fixture_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The broken, future-version and failing-hook plugins, pip-installed into their own
    folder so they are discovered only by the tests that put it on PYTHONPATH."""
    target = tmp_path_factory.mktemp("fixture-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(target), *(str(FIXTURES / n) for n in ("broken", "future", "badhook"))],
        check=True,
    )
    return target


def host_with(site: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> PluginHost:
    """A plugin host in this process that also sees the fixture site (real entry points:
    only sys.path changes, as PYTHONPATH would)."""
    monkeypatch.syspath_prepend(str(site))
    return PluginHost(env=env)


def test_plugins_lists_every_distribution_and_platform_availability() -> None:
    result = run_octavo("plugins")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for dist in DISTRIBUTIONS + ["octavo-plugin-hello"]:
        assert f"{dist} 0.1.0" in out, f"{dist} missing from:\n{out}"
    assert "cpu: yes" in out
    assert "torch.version.cuda is None" in out  # cuda: CPU-only torch build
    assert "torch.version.hip is None" in out  # rocm
    assert "JAX" in out and "tpu: no" in out
    assert "no Neuron devices (looked for /dev/neuron*)" in out
    for name in ("cuda", "rocm", "tpu", "neuron"):
        assert f"{name}: no (" in out


def test_example_plugin_is_discovered_and_its_policy_used() -> None:
    host = PluginHost(env={})
    record = host.record("hello")
    assert record.loaded and record.distribution == "octavo-plugin-hello"
    assert record.hooks == ["octavo_register_scheduling_policies"]
    registries = Registries()
    host.fill(registries)
    entry = registries.scheduling_policies.entry("shortest-prompt-first")
    assert entry.plugin == "hello"
    policy = entry.obj()
    params = SamplingParams()
    reqs = [Request(f"r{n}", list(range(n)), params, arrival_time=float(i))
            for i, n in enumerate([30, 5, 12])]
    assert [r.request_id for r in policy.order(reqs)] == ["r5", "r12", "r30"]
    assert policy.pick_victim(reqs).request_id == "r30"


def test_broken_plugin_is_isolated(fixture_site: Path) -> None:
    result = run_octavo("plugins", site=fixture_site)
    assert result.returncode == 0, result.stderr
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("broken "))
    assert "skipped: failed to import octavo_fixture_broken.plugin" in line
    assert "deliberately broken" in line
    assert "cpu: yes" in result.stdout and "octavo-plugin-hello" in result.stdout


def test_failing_hook_is_rolled_back(fixture_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = host_with(fixture_site, monkeypatch, env={})
    registries = Registries()
    host.fill(registries)
    record = host.record("badhook")
    assert not record.loaded and "ValueError" in record.reason
    assert "half" not in registries.platforms
    assert "cpu" in registries.platforms and "cuda" in registries.platforms


def test_version_range_excludes_plugin_before_import(
    fixture_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = host_with(fixture_site, monkeypatch, env={})
    record = host.record("future")
    assert not record.loaded
    assert "requires octavo>=99" in record.reason and "octavo 0.1.0" in record.reason
    assert "octavo_fixture_future" not in sys.modules


def test_core_version_problem_reads_the_declared_range() -> None:
    from importlib.metadata import distribution

    dist = distribution("octavo-cuda")
    assert core_version_problem(dist, "0.1.0") == ""
    assert "requires octavo" in core_version_problem(dist, "0.2.0")
    assert core_version_problem(None) == ""


def test_octavo_plugins_env_filter(fixture_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = host_with(fixture_site, monkeypatch, env={"OCTAVO_PLUGINS": "hello, cuda"})
    loaded = {r.name for r in host.records if r.loaded}
    assert loaded == {"octavo", "hello", "cuda"}
    skipped = host.record("rocm")
    assert skipped.reason == "not selected by OCTAVO_PLUGINS"
    # A filtered-out plugin is not imported: the broken one does not even get to fail.
    assert host.record("broken").reason == "not selected by OCTAVO_PLUGINS"


def test_registry_rejects_silent_override() -> None:
    registry: Registry[int] = Registry("thing")
    registry.current_plugin = "a"
    registry.register("x", 1)
    registry.current_plugin = "b"
    with pytest.raises(RegistryError, match="already registered by plugin 'a'"):
        registry.register("x", 2)
    registry.register("x", 3, override=True)
    assert registry.entry("x").plugin == "b" and registry.get("x") == 3
    with pytest.raises(RegistryError, match="unknown thing 'y'; registered: x"):
        registry.get("y")
