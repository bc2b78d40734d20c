"""Acceptance of issue 53 through the server: all-MiniLM-L6-v2 behind
``octavo serve --runner pooling`` and the official ``openai`` client, against
sentence-transformers' own encode() of the same folder (cosine >= 0.9999 for 64 sentences
of mixed lengths, in one request and in 16 concurrent ones; base64 equal to float), and
what the endpoint refuses - the server serving on after each refusal."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from openai import BadRequestError, NotFoundError, OpenAI

from octavo.testing.seeds import draw_seed

from ..embedding_models import mixed_sentences
from .server import API_KEY, Server
from .test_serve_vllm_metrics import scrape, total

MIN_COSINE = 0.9999
NUM_SENTENCES = 64
CONCURRENT = 16


@pytest.fixture(scope="module")
def minilm_server(minilm_folder: Path, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("minilm-server") / "server.log"
    with Server(["--model", str(minilm_folder), "--runner", "pooling", "--dtype", "float32",
                 "--api-key", API_KEY], log) as server:
        yield server


@pytest.fixture(scope="module")
def embed_client(minilm_server: Server) -> OpenAI:
    return OpenAI(base_url=f"{minilm_server.url}/v1", api_key=API_KEY, max_retries=0,
                  timeout=120)


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    return mixed_sentences(NUM_SENTENCES, draw_seed())


@pytest.fixture(scope="module")
def reference(minilm_folder: Path, sentences: list[str]) -> np.ndarray:
    """sentence-transformers' embeddings of ``sentences`` (normalised, as the folder's
    Normalize module makes them), in fp32 on the CPU."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_folder), device="cpu")
    return model.encode(sentences, batch_size=NUM_SENTENCES, convert_to_numpy=True)


def cosines(embeddings: list[list[float]], reference: np.ndarray) -> np.ndarray:
    ours = np.asarray(embeddings, dtype=np.float64)
    ref = reference.astype(np.float64)
    return (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)


def test_minilm_matches_sentence_transformers(embed_client: OpenAI, minilm_folder: Path,
                                              sentences: list[str],
                                              reference: np.ndarray) -> None:
    model = str(minilm_folder)
    cards = embed_client.models.list().data
    assert [card.model_extra["supported_tasks"] for card in cards] == [["embed"]]
    one = embed_client.embeddings.create(model=model, input=sentences, encoding_format="float")
    assert [d.index for d in one.data] == list(range(NUM_SENTENCES))
    one_cos = cosines([d.embedding for d in one.data], reference)
    # The client asks for base64 by default and decodes it into floats itself. The same
    # input alone in the engine gives the same floats, bit for bit, in either format; a
    # batch's floats depend on how the engine's steps happened to group the inputs (the
    # padded attention batch), so the 64 agree to float32 rounding only.
    encoded = embed_client.embeddings.create(model=model, input=sentences)
    np.testing.assert_allclose([d.embedding for d in encoded.data],
                               [d.embedding for d in one.data], rtol=0, atol=1e-6)
    alone = [embed_client.embeddings.create(model=model, input=sentences[0], **extra)
             for extra in ({"encoding_format": "float"}, {})]
    assert alone[0].data[0].embedding == alone[1].data[0].embedding
    assert one.usage.prompt_tokens == one.usage.total_tokens > 3 * NUM_SENTENCES

    batches = [sentences[i::CONCURRENT] for i in range(CONCURRENT)]
    with ThreadPoolExecutor(CONCURRENT) as pool:
        answers = list(pool.map(lambda batch: embed_client.embeddings.create(
            model=model, input=batch, encoding_format="float"), batches))
    concurrent = [None] * NUM_SENTENCES
    for i, answer in enumerate(answers):
        for j, item in enumerate(answer.data):
            concurrent[i + j * CONCURRENT] = item.embedding
    many_cos = cosines(concurrent, reference)  # type: ignore[arg-type]
    print(f"1 - cosine with sentence-transformers, worst of {NUM_SENTENCES}: one request "
          f"{1 - one_cos.min():.1e}, {CONCURRENT} concurrent {1 - many_cos.min():.1e}")
    assert one_cos.min() >= MIN_COSINE and many_cos.min() >= MIN_COSINE


def test_refusals_are_400s_and_the_server_serves_on(embed_client: OpenAI, minilm_folder: Path,
                                                    minilm_server: Server) -> None:
    model = str(minilm_folder)
    refused = {
        "the input list is empty": {"input": []},
        "takes at most 256": {"input": "word " * 300},
        "does not support Matryoshka": {"input": "hi", "dimensions": 8},
        "outside the vocabulary": {"input": [[1, 2, 10**6]]},
    }
    for message, body in refused.items():
        with pytest.raises(BadRequestError, match=message):
            embed_client.embeddings.create(model=model, **body)  # type: ignore[arg-type]
    with pytest.raises(NotFoundError):
        embed_client.embeddings.create(model="another", input="hi")
    with pytest.raises(BadRequestError, match="pooling runner"):
        embed_client.completions.create(model=model, prompt="hello", max_tokens=2)
    with pytest.raises(BadRequestError, match="pooling runner"):
        embed_client.chat.completions.create(model=model, max_tokens=2,
                                             messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(BadRequestError, match="pooling runner"):
        embed_client.responses.create(model=model, input="hi", max_output_tokens=2)
    status, _, body = minilm_server.request("POST", "/v1/embeddings",
                                            {"input": "hi", "encoding_format": "bytes"},
                                            api_key=API_KEY)
    assert status == 400 and "encoding_format" in body["error"]["message"]
    assert len(embed_client.embeddings.create(model=model, input="still here").data) == 1


def test_embeddings_are_counted_under_vllm_metric_names(embed_client: OpenAI,
                                                        minilm_folder: Path,
                                                        minilm_server: Server) -> None:
    """Each input is one pooling request: it stops (vLLM's reason) with its prompt counted;
    its phases, which its output does not time, are not observed."""
    before = scrape(minilm_server)
    answer = embed_client.embeddings.create(model=str(minilm_folder), input=["one", "two"])
    after = scrape(minilm_server)

    def grew(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert grew("vllm:request_success_total", finished_reason="stop") == 2
    assert grew("vllm:e2e_request_latency_seconds_count") == 2
    assert grew("vllm:prompt_tokens_total") == answer.usage.prompt_tokens
    assert grew("vllm:request_prompt_tokens_sum") == answer.usage.prompt_tokens
    assert grew("vllm:generation_tokens_total") == 0
    assert grew("vllm:request_queue_time_seconds_count") == 0
    # The encoder reads prompts whole: its core turned prefix caching off, and says so.
    assert [dict(labels)["enable_prefix_caching"] for name, labels in after
            if name == "vllm:cache_config_info"] == ["False"]


def test_a_generation_server_refuses_embeddings(client: OpenAI) -> None:
    card = client.models.list().data[0]
    assert card.model_extra["supported_tasks"] == ["generate"]
    with pytest.raises(BadRequestError, match="served for text generation"):
        client.embeddings.create(model=card.id, input="hello")
