"""The pooling runner offline (issue 53), on tiny random BERTs written as
sentence-transformers folders: the encoder's pooled vectors against HF transformers'
BertModel (CLS as the folder declares, MEAN from --pooler-config, Matryoshka dimensions,
normalisation), whole prompts never split across steps, and what is refused - each
refusal names its cause."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from octavo import LLM, PoolingParams
from octavo.config import ConfigError, EngineConfig
from octavo.cpu.platform import CpuPlatform
from octavo.engine.errors import InvalidRequestError
from octavo.engine.runner_setup import setup_runner
from octavo.entrypoints.generate_cmd import generate
from octavo.models.loader import ModelLoadError, load_model_files
from octavo.models.sentence_transformers import folder_pooler_config
from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import save_tiny_model
from tests.embedding_models import save_tiny_bert

pytestmark = pytest.mark.usefixtures("single_thread")

MATRYOSHKA = [16, 32, 64]
MAX_POSITIONS = 128  # the tiny BERT's max_position_embeddings, so its max_model_len
# Token ids of mixed lengths (a padded attention batch), the longest at max_model_len.
PROMPTS = [[5], list(range(10, 17)), list(range(40, 73)), list(range(100, 190)),
           list(range(1, MAX_POSITIONS + 1))]


class OtherWorkerPlatform(CpuPlatform):
    """A platform whose worker is not the core's (as the TPU plugin's JAX worker)."""

    worker_cls = "octavo.worker.interface.WorkerInterface"


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("tiny-bert")
    hf = save_tiny_bert(folder, draw_seed(), pooling_mode="cls",
                        matryoshka_dimensions=MATRYOSHKA)
    return folder, hf


def hf_hidden(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).last_hidden_state[0]


def embeddings(llm: LLM, prompts: list[list[int]], params: PoolingParams | None = None,
               ) -> list[torch.Tensor]:
    outputs = llm.embed([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == prompts
    return [torch.tensor(o.outputs.embedding) for o in outputs]


def test_tiny_bert_pools_as_hf_and_never_splits_a_prompt(tiny_bert) -> None:  # type: ignore[no-untyped-def]
    folder, hf = tiny_bert
    # The budget holds exactly one longest prompt: the others must wait for later steps.
    llm = LLM(model=str(folder), dtype="float32", max_num_batched_tokens=MAX_POSITIONS)
    # runner=auto settled on pooling, which turns off async scheduling's default.
    assert llm.llm_engine.core.batch_queue is None
    scheduler = llm.llm_engine.core.scheduler
    assert not scheduler.async_scheduling
    plan = scheduler.schedule
    steps: list[dict[str, int]] = []
    scheduler.schedule = lambda: steps.append((out := plan()).num_scheduled_tokens) or out
    cls = embeddings(llm, PROMPTS)  # the folder's pooling: CLS, not normalised
    references = [hf_hidden(hf, ids) for ids in PROMPTS]
    for ids, ours, reference in zip(PROMPTS, cls, references):
        assert torch.allclose(ours, reference[0], atol=1e-5), (len(ids), ours - reference[0])
    lengths = {len(p) for p in PROMPTS}
    assert len(steps) > 1 and all(n in lengths for step in steps for n in step.values())

    matryoshka = embeddings(llm, PROMPTS, PoolingParams(dimensions=32, use_activation=True))
    for ours, reference in zip(matryoshka, references):  # cut first, then normalised
        assert torch.allclose(ours, F.normalize(reference[0, :32], dim=0), atol=1e-5)
    llm.shutdown()

    mean = LLM(model=str(folder), dtype="float32",
               pooler_config={"pooling_type": "MEAN", "use_activation": True})
    for ours, reference in zip(embeddings(mean, PROMPTS), references):
        assert torch.allclose(ours, F.normalize(reference.mean(0), dim=0), atol=1e-5)
    with pytest.raises(InvalidRequestError, match="pooling runner"):
        mean.generate("hello")
    with pytest.raises(InvalidRequestError, match=f"at most {MAX_POSITIONS}"):
        mean.embed({"prompt_token_ids": [1] * (MAX_POSITIONS + 1)})
    with pytest.raises(InvalidRequestError, match=r"supports \[16, 32, 64\] only"):
        mean.embed("hello", PoolingParams(dimensions=48))
    mean.shutdown()


def test_refusals_name_their_cause(tiny_bert, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    folder, _ = tiny_bert
    with pytest.raises(ConfigError, match="BertModel is an encoder.*--runner pooling"):
        LLM(model=str(folder), runner="generate")
    with pytest.raises(ConfigError, match="async scheduling .* the pooling runner"):
        LLM(model=str(folder), async_scheduling=True)  # runner=auto: an encoder pools
    with pytest.raises(ConfigError, match="max_num_batched_tokens=64 is below max_model_len"):
        LLM(model=str(folder), max_num_batched_tokens=64)
    with pytest.raises(ConfigError, match="tensor_parallel_size=2"):
        EngineConfig.from_kwargs(runner="pooling", tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="unknown key 'normalize'"):
        EngineConfig.from_kwargs(pooler_config={"normalize": True})

    files = load_model_files(folder)
    with pytest.raises(ConfigError, match="has no pooling runner"):
        setup_runner(EngineConfig(), files, MAX_POSITIONS, OtherWorkerPlatform)
    cli = CliRunner().invoke(generate, ["hello", "--model", str(folder)])
    assert cli.exit_code == 1 and "served by the pooling runner" in cli.output, cli.output

    dense = tmp_path / "dense"
    shutil.copytree(folder, dense)
    modules = json.loads((dense / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Dense",
                    "type": "sentence_transformers.models.Dense"})
    (dense / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelLoadError, match="'sentence_transformers.models.Dense' is not"):
        folder_pooler_config(dense)

    llama = tmp_path / "llama"
    save_tiny_model("llama", llama, seed=draw_seed())
    with pytest.raises(ConfigError, match="pooler_config applies to the pooling runner"):
        LLM(model=str(llama), pooler_config={"pooling_type": "MEAN"})
    generator = LLM(model=str(llama), dtype="float32", kv_cache_memory=2**24)
    with pytest.raises(InvalidRequestError, match="served for text generation"):
        generator.embed("hello")
    generator.shutdown()


def test_tiny_decoder_mean_pooling_matches_hf(tmp_path: Path) -> None:
    """A decoder with MEAN pooling (whole prompts through the paged KV path) against the
    mean of HF's final-norm hidden states, normalised."""
    hf = save_tiny_model("llama", tmp_path, seed=draw_seed())
    llm = LLM(model=str(tmp_path), runner="pooling", dtype="float32",
              max_num_batched_tokens=512, pooler_config={"pooling_type": "MEAN"})
    # No --kv-cache-memory: a step's blocks (512 / 16 + 256 requests) and one whole prompt's.
    context = hf.config.max_position_embeddings
    assert llm.llm_engine.core.num_blocks == 512 // 16 + 256 + context // 16
    prompts = [list(range(3, 3 + n)) for n in (1, 9, 40, 200)]
    for ids, ours in zip(prompts, embeddings(llm, prompts)):
        with torch.no_grad():
            hidden = hf.model(torch.tensor([ids])).last_hidden_state[0]
        assert torch.allclose(ours, F.normalize(hidden.mean(0), dim=0), atol=1e-5), len(ids)
    llm.shutdown()
