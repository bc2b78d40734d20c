"""Every EOS id of a model ends a request, and generation_config.json gives the sampling
defaults of requests that leave them unset (vLLM's ``--generation-config auto|vllm|PATH``),
through the offline ``LLM`` on a tiny random Llama; the reference is HF transformers'
greedy continuation on the same weights, fp32 (tests/core/generation_reference.py)."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

from octavo import LLM, SamplingParams
from octavo.config import ConfigError, EngineConfig
from octavo.entrypoints.engine_args import build_config, engine_options
from octavo.models.config import eos_token_ids
from octavo.models.generation_config import read_generation_config
from octavo.models.loader import ModelLoadError, load_model_files
from octavo.models.loader.gguf_config import _eos_token_ids
from octavo.testing.seeds import draw_seed
from tests.core.generation_reference import hf_greedy, model_copy, pick_stop_ids, stopped
from tests.core.tiny_models import EOS_ID, save_tiny_model
from tests.helpers import Records

NUM_TOKENS = 12  # of each reference continuation
DEFAULT_MAX = 5  # the max_new_tokens of the generation configs below


class Model:
    """A fresh tiny model, its prompts and HF's greedy continuations of them."""

    def __init__(self, folder: Path) -> None:
        self.seed = draw_seed()
        rng = np.random.default_rng(self.seed)
        self.folder = folder
        hf_model = save_tiny_model("llama", folder, seed=self.seed)
        self.prompts = [rng.integers(0, 256, int(rng.integers(3, 10))).tolist()
                        for _ in range(8)]
        self.greedy = hf_greedy(hf_model, self.prompts, NUM_TOKENS)
        self.rng = random.Random(self.seed)

    def llm(self, folder: Path, **kwargs) -> LLM:  # type: ignore[no-untyped-def]
        return LLM(model=str(folder), dtype="float32", kv_cache_memory=4 * 2**20, **kwargs)

    def generate(self, llm: LLM, params: SamplingParams | None = None):  # type: ignore[no-untyped-def]
        outputs = llm.generate([{"prompt_token_ids": p} for p in self.prompts], params,
                               use_tqdm=False)
        return [o.outputs[0] for o in outputs]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Model:
    return Model(tmp_path_factory.mktemp("tiny") / "model")


def check_stops(model: Model, outputs, stop_ids: list[int], primary: int, limit: int,
                ) -> None:  # type: ignore[no-untyped-def]
    """Each output is the reference cut at its first stop id: finish "stop" with vLLM's
    stop reason (None for the primary EOS, the id for the others), else "length" (also
    when the stop id is the last token allowed: length is checked first, as in vLLM)."""
    for reference, output in zip(model.greedy, outputs):
        expected = stopped(reference, set(stop_ids), limit)
        assert output.token_ids == expected, f"model seed {model.seed}, stops {stop_ids}"
        if len(expected) == limit:
            assert (output.finish_reason, output.stop_reason) == ("length", None)
        else:
            reason = None if expected[-1] == primary else expected[-1]
            assert (output.finish_reason, output.stop_reason) == ("stop", reason)


def test_every_eos_id_of_config_json_stops(model: Model, tmp_path: Path) -> None:
    """config.json lists three EOS ids, each the first to come in some continuation: each
    ends its request; ignore_eos runs through them all; min_tokens blocks all of them."""
    eos = pick_stop_ids(model.greedy, 3, model.rng, NUM_TOKENS - 1)
    folder = model_copy(model.folder, tmp_path / "eos-list", eos_token_id=eos,
                        generation_config={"bos_token_id": 256})
    llm = model.llm(folder)
    greedy = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS)
    outputs = model.generate(llm, greedy)
    check_stops(model, outputs, eos, eos[0], NUM_TOKENS)
    assert {o.token_ids[-1] for o in outputs if o.finish_reason == "stop"} == set(eos)

    ignoring = model.generate(llm, SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS,
                                                  ignore_eos=True))
    assert [o.token_ids for o in ignoring] == model.greedy, f"model seed {model.seed}"

    min_tokens = 6
    held = model.generate(llm, SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS,
                                              min_tokens=min_tokens))
    for output in held:
        assert len(output.token_ids) >= min_tokens
        assert not set(output.token_ids[:min_tokens - 1]) & set(eos), f"seed {model.seed}"


def test_an_eos_id_only_in_generation_config_stops_and_its_defaults_apply(
        model: Model, tmp_path: Path) -> None:
    """generation_config.json adds an EOS id and sets temperature 0 and max_new_tokens: a
    request that sets nothing is greedy and stops there; one that sets fields keeps them."""
    # Within the first DEFAULT_MAX - 1 tokens: on the last one, "length" would win.
    [extra] = pick_stop_ids(model.greedy, 1, model.rng, DEFAULT_MAX - 1)
    folder = model_copy(model.folder, tmp_path / "generation-config", generation_config={
        "eos_token_id": [EOS_ID, extra], "temperature": 0.0, "max_new_tokens": DEFAULT_MAX})
    records = Records()
    logging.getLogger("octavo.models.generation_config").addHandler(records)
    try:
        llm = model.llm(folder)
    finally:
        logging.getLogger("octavo.models.generation_config").removeHandler(records)
    message = " ".join(r.getMessage() for r in records.records)
    assert "Default sampling parameters have been overridden" in message
    assert "temperature=0.0" in message and f"max_tokens={DEFAULT_MAX}" in message
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.max_tokens) == (0.0, DEFAULT_MAX)
    assert defaults.top_p == SamplingParams().top_p  # what the file leaves out stays

    stop_ids = [EOS_ID, extra]
    outputs = model.generate(llm)
    check_stops(model, outputs, stop_ids, EOS_ID, DEFAULT_MAX)
    assert extra in [o.stop_reason for o in outputs]  # vLLM's stop reason: the id
    longer = model.generate(llm, SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS))
    check_stops(model, longer, stop_ids, EOS_ID, NUM_TOKENS)
    # max_tokens=None: the model's max_new_tokens, within the context.
    unbounded = model.generate(llm, SamplingParams(temperature=0.0, max_tokens=None))
    check_stops(model, unbounded, stop_ids, EOS_ID, DEFAULT_MAX)


def test_generation_config_vllm_ignores_the_defaults_but_keeps_the_eos_ids(
        model: Model, tmp_path: Path) -> None:
    [extra] = pick_stop_ids(model.greedy, 1, model.rng, NUM_TOKENS)
    folder = model_copy(model.folder, tmp_path / "vllm", generation_config={
        "eos_token_id": extra, "temperature": 0.0, "max_new_tokens": DEFAULT_MAX})
    llm = model.llm(folder, generation_config="vllm")
    assert llm.get_default_sampling_params() == SamplingParams()
    outputs = model.generate(llm)  # the built-in defaults: temperature 1, 16 tokens
    assert all(len(o.token_ids) == 16 or o.finish_reason == "stop" for o in outputs)
    greedy = model.generate(llm, SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS))
    check_stops(model, greedy, [EOS_ID, extra], EOS_ID, NUM_TOKENS)


def test_generation_config_path_names_another_folder(model: Model, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.0, "max_new_tokens": 3}))
    llm = model.llm(model.folder, generation_config=str(elsewhere))
    check_stops(model, model.generate(llm), [EOS_ID], EOS_ID, 3)


def test_bad_generation_configs_fail_naming_the_file(model: Model, tmp_path: Path) -> None:
    files = load_model_files(model.folder)
    with pytest.raises(ModelLoadError, match="holds no generation_config.json|holding"):
        read_generation_config(files, str(tmp_path))
    bad = tmp_path / "bad"
    bad.mkdir()
    for content, problem in (({"temperature": "hot"}, "temperature must be a number"),
                             ({"top_p": 0.0}, "top_p must be in"),
                             ({"max_new_tokens": 2.5}, "max_new_tokens must be a number"),
                             ({"eos_token_id": [2, "x"]}, "eos_token_id must be a token id")):
        (bad / "generation_config.json").write_text(json.dumps(content))
        with pytest.raises(ModelLoadError, match=problem) as error:
            config = read_generation_config(files, str(bad))
            config.sampling_defaults()
            eos_token_ids(files.hf_config, config)
        assert str(bad / "generation_config.json") in str(error.value)
    (bad / "generation_config.json").write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match="expected a JSON object"):
        read_generation_config(files, str(bad))


class _Gguf:
    """The metadata lookups of a GGUF file (``GgufFile.get``)."""

    def __init__(self, **ids: int) -> None:
        self.ids = {f"tokenizer.ggml.{kind}_token_id": value for kind, value in ids.items()}

    def get(self, key: str, default=None):  # type: ignore[no-untyped-def]
        return self.ids.get(key, default)


def test_a_gguf_end_of_turn_id_joins_its_eos() -> None:
    """Llama 3 Instruct GGUFs: EOS <|end_of_text|> 128001, end of turn <|eot_id|> 128009."""
    assert _eos_token_ids(_Gguf(eos=128001, eot=128009)) == [128001, 128009]
    assert _eos_token_ids(_Gguf(eos=2, eot=2)) == 2  # one id stays an int, as HF writes it
    assert _eos_token_ids(_Gguf(eos=5, eom=7)) == [5, 7]
    assert _eos_token_ids(_Gguf()) is None


def test_the_flag_and_keyword_are_vllms() -> None:
    @click.command()
    @engine_options
    def command(**kwargs: object) -> None:
        click.echo(build_config(dict(kwargs)).model.generation_config)

    runner = CliRunner()
    assert runner.invoke(command, []).output.strip() == "auto"
    assert runner.invoke(command, ["--generation-config", "vllm"]).output.strip() == "vllm"
    assert "--generation-config" in runner.invoke(command, ["--help"]).output
    assert EngineConfig.from_kwargs(generation_config="/x").model.generation_config == "/x"
    with pytest.raises(ConfigError, match="generation_config must be auto, vllm or a folder"):
        EngineConfig.from_kwargs(generation_config="")
