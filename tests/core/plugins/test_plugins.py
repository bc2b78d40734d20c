"""The plugin system through real entry points: installed distributions, fixture plugins
installed with pip into a throw-away folder, and the ``octavo`` CLI in subprocesses."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from octavo.plugins import PluginHost, Registries, Registry, RegistryError, hookimpl
from octavo.plugins.api_version import PLUGIN_API_VERSION
from octavo.plugins.manager import core_version_problem
from octavo.request import Request
from octavo.sampling_params import SamplingParams
from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import save_tiny_model
from tests.helpers import run_octavo

pytestmark = pytest.mark.needs_plugins

FIXTURES = Path(__file__).parent / "plugin_fixtures"
DISTRIBUTIONS = ["octavo", "octavo-triton", "octavo-cuda", "octavo-rocm", "octavo-tpu",
                 "octavo-neuron", "octavo-connectors", "octavo-spec-decode"]


@pytest.fixture(scope="session")
def fixture_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The broken, future-version, old-plugin-API, failing-hook and custom-scheduler plugins,
    pip-installed into their own folder so they are discovered only by the tests that put it
    on PYTHONPATH."""
    target = tmp_path_factory.mktemp("fixture-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(target),
         *(str(FIXTURES / n) for n in ("broken", "future", "badhook", "oldapi", "custom"))],
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


def test_plugin_api_range_excludes_plugin_before_import(
    fixture_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = host_with(fixture_site, monkeypatch, env={})
    record = host.record("oldapi")
    assert not record.loaded
    assert "written for plugin API >=0.1,<1" in record.reason
    assert f"this core provides plugin API {PLUGIN_API_VERSION}" in record.reason
    assert "octavo_fixture_oldapi.plugin" not in sys.modules
    assert host.record("custom").loaded  # same site, a compatible range


def test_a_plugin_adds_a_tool_call_and_a_reasoning_parser(
        fixture_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from octavo.entrypoints.openai.parser_registry import find_parser
    from octavo.entrypoints.openai.reasoning_parsers import BUILTIN_REASONING_PARSERS, Opening
    from octavo.entrypoints.openai.tool_parsers import BUILTIN_TOOL_PARSERS

    host = host_with(fixture_site, monkeypatch, env={})
    registries = Registries()
    host.fill(registries)
    assert registries.tool_parsers.entry("call_tag").plugin == "custom"
    tools = find_parser(BUILTIN_TOOL_PARSERS, registries.tool_parsers, "call_tag")()
    parsed = tools.parse('Sure. <call>get_weather {"city": "Oslo"}</call>', final=True)
    assert parsed.content == "Sure. "
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", '{"city": "Oslo"}')]
    assert tools.structural_tag([{"name": "f", "parameters": {}}])["format"]["triggers"] == [
        "<call>"]
    reasoning = find_parser(BUILTIN_REASONING_PARSERS, registries.reasoning_parsers, "reflect")()
    split = reasoning.split("<reflect>Hmm.</reflect>Yes.", Opening.MAY_THINK, final=True)
    assert (split.reasoning, split.content) == ("Hmm.", "Yes.")
    with pytest.raises(ValueError, match="choose from hermes, llama3_json, mistral, "
                                         "pythonic, call_tag"):
        find_parser(BUILTIN_TOOL_PARSERS, registries.tool_parsers, "calltag")


def test_in_repo_plugins_declare_the_current_api() -> None:
    host = PluginHost(env={})
    for name in ("triton", "cuda", "rocm", "tpu", "neuron", "connectors", "spec_decode", "hello"):
        assert host.record(name).loaded, host.record(name).reason


def test_scheduler_and_kv_manager_named_by_the_config_are_used(
    fixture_site: Path, tmp_path: Path
) -> None:
    save_tiny_model("llama", tmp_path, seed=draw_seed())
    result = run_octavo("generate", "--raw", "hello", "--model", str(tmp_path),
                        "--max-tokens", "4", "--scheduler-cls", "counting",
                        "--kv-manager", "counting", site=fixture_site)
    assert result.returncode == 0, result.stderr
    assert "octavo-fixture-custom: KV manager built with" in result.stderr
    assert "octavo-fixture-custom: scheduler built with CountingKVManager" in result.stderr
    planned = re.search(r"scheduler planned (\d+) steps", result.stderr)
    assert planned is not None and int(planned.group(1)) >= 1, result.stderr
    default = run_octavo("generate", "--raw", "hello", "--model", str(tmp_path),
                         "--max-tokens", "4", site=fixture_site)
    assert default.returncode == 0 and "octavo-fixture-custom" not in default.stderr


@pytest.mark.parametrize(("flag", "value", "kind", "known"), [
    ("--scheduler-cls", "countng", "scheduler", "default, counting"),
    ("--kv-manager", "countng", "KV manager", "default, counting"),
    ("--scheduling-policy", "lifo", "scheduling policy", "fcfs, priority"),
    ("--attention-backend", "flash", "attention backend", "torch, cpu, nki, triton"),
])
def test_misspelt_names_are_refused_with_the_registered_ones(
    fixture_site: Path, flag: str, value: str, kind: str, known: str
) -> None:
    result = run_octavo("generate", "hello", flag, value, site=fixture_site)
    assert result.returncode == 2, result.stderr
    assert f"unknown {kind} {value!r}; registered: {known}" in result.stderr
    assert "Loading" not in result.stderr  # refused before any model load


def test_trace_plugins_prints_hook_calls_and_registrations() -> None:
    env = {**os.environ, "OCTAVO_TRACE_PLUGINS": "1"}
    result = subprocess.run([sys.executable, "-c", "from octavo.plugins import get_registries;"
                             " get_registries()"], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "octavo plugins: octavo registered platform 'cpu'" in result.stderr
    assert "octavo plugins: cuda registered platform 'cuda'" in result.stderr
    assert "octavo_register_platforms" in result.stderr  # pluggy's own trace of the hook call


def test_hook_wrappers_of_other_plugins_wrap_each_call() -> None:
    """Hooks go through pluggy's machinery: another plugin's wrapper sees every plugin's call."""
    seen: list[str] = []

    class Wrapper:
        @hookimpl(wrapper=True)
        def octavo_register_platforms(self, registry: Registry[Any]) -> Any:
            seen.append(registry.current_plugin)
            return (yield)

    host = PluginHost(env={"OCTAVO_PLUGINS": "cuda"})
    host.pm.register(Wrapper(), name="wrapper")
    host.fill(Registries())
    assert "octavo" in seen and "cuda" in seen


def test_a_deprecated_plugin_api_name_warns_and_still_works(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    import octavo.plugin_api as api

    monkeypatch.setitem(api._DEPRECATED, "OldPlatform",
                        ("octavo.platforms:Platform", "octavo.plugin_api.Platform", "2.0"))
    for _ in range(2):  # every access warns
        with pytest.warns(DeprecationWarning, match="goes in plugin API 2.0; use "
                                                    "octavo.plugin_api.Platform"):
            assert api.OldPlatform is api.Platform
    with pytest.raises(AttributeError, match=f"plugin API {api.PLUGIN_API_VERSION}"):
        api.NoSuchName  # noqa: B018


def test_every_plugin_api_name_resolves() -> None:
    import octavo.plugin_api as api

    for name in api.__all__:
        assert getattr(api, name) is not None, name
    for name, (_, instead, _) in api._DEPRECATED.items():
        with pytest.warns(DeprecationWarning, match=re.escape(instead)):
            assert getattr(api, name) is not None, name
        assert name not in api.__all__


def test_plugin_api_type_view_agrees_with_the_run_time_exports() -> None:
    """The ``TYPE_CHECKING`` imports (what mypy sees) name exactly the exported names, each
    from the module and attribute ``_EXPORTS`` resolves it to at run time."""
    import octavo.plugin_api as api

    tree = ast.parse(Path(api.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    typed = {alias.asname or alias.name: f"{node.module}:{alias.name}"
             for node in block.body if isinstance(node, ast.ImportFrom)
             for alias in node.names}
    assert typed == api._EXPORTS
