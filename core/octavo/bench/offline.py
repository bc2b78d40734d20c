"""What the offline benchmarks (latency, throughput) share: running requests through an
``LLM``'s engine for exactly as many tokens as each specifies, and the warm-up before timing."""

from __future__ import annotations

from tqdm.auto import tqdm

from octavo.bench.datasets import BenchRequest, token_range
from octavo.engine.llm import LLM
from octavo.engine.outputs import RequestOutput
from octavo.sampling_params import SamplingParams, StructuredOutputsParams

WARMUP_PROMPT_LEN = 16
WARMUP_OUTPUT_LEN = 4


def fixed_length_params(output_len: int, structured: StructuredOutputsParams | None = None,
                        ) -> SamplingParams:
    """Greedy, and ``ignore_eos`` so every request yields exactly ``output_len`` tokens: the
    token counts a benchmark reports must not depend on what the model happens to say.
    With a ``structured`` constraint a request also ends when its grammar is complete."""
    return SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True,
                          structured_outputs=structured)


def generate(llm: LLM, requests: list[BenchRequest], show_progress: bool = True,
             structured: StructuredOutputsParams | None = None) -> list[RequestOutput]:
    """Run every request to completion (the engine batches them as it likes); outputs in
    request order. Progress is counted in output tokens, not requests: in a throughput run
    every request finishes near the end, so a request count would sit at zero for minutes."""
    engine = llm.llm_engine
    ids = [engine.add_request({"prompt": r.prompt} if isinstance(r.prompt, str)
                              else {"prompt_token_ids": r.prompt},
                              fixed_length_params(r.output_len, structured))
           for r in requests]
    produced: dict[str, int] = {}
    finished: dict[str, RequestOutput] = {}
    with tqdm(total=sum(r.output_len for r in requests), desc="Output tokens", unit="tok",
              disable=not show_progress, dynamic_ncols=True) as bar:
        while engine.has_unfinished_requests():
            for output in engine.step():
                assert isinstance(output, RequestOutput), "octavo bench measures generation"
                count = len(output.outputs[0].token_ids)
                bar.update(count - produced.get(output.request_id, 0))
                produced[output.request_id] = count
                if output.finished:
                    finished[output.request_id] = output
    return [finished[i] for i in ids]


def warm_up(llm: LLM, structured: StructuredOutputsParams | None = None) -> None:
    """One short request before timing, so one-time costs (first kernel calls, allocator
    growth, compiling the ``structured`` grammar) are not billed to the measured run. A
    constant prompt shares no cache block with random ones, so it seeds no prefix-cache hit."""
    _, high = token_range(len(llm.get_tokenizer()))
    request = BenchRequest([high - 1] * WARMUP_PROMPT_LEN, WARMUP_PROMPT_LEN, WARMUP_OUTPUT_LEN)
    generate(llm, [request], show_progress=False, structured=structured)
