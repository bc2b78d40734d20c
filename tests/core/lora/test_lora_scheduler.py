"""The scheduler caps distinct LoRA adapters per step at max_loras, starves no adapter,
and keys the prefix cache on the adapter's content."""

from __future__ import annotations

from octavo.block_hash import first_block_extra_keys
from octavo.lora_request import LoRAAdapterRef
from octavo.outputs import SchedulerOutput
from tests.core.scheduler_fakes import FakeRunner, make_request, make_scheduler, run_to_completion

BS = 4


def adapter(name: str) -> LoRAAdapterRef:
    return LoRAAdapterRef(name, f"/adapters/{name}", digest=f"digest-{name}")


def test_at_most_max_loras_adapters_per_step_and_none_starves() -> None:
    scheduler = make_scheduler(num_blocks=256, max_model_len=256, block_size=BS,
                               max_num_seqs=8, max_num_batched_tokens=64, enable_lora=True,
                               max_loras=2)
    # A stream for adapters a and b, with one request for c queued behind the first ones:
    # c must run before the later a/b requests (they may not pass it for ever).
    names = ["a", "b", "a", "c", "b", "a", None, "b", "a"]
    for i, name in enumerate(names):
        request = make_request(f"r{i}", [i + 1] * 6, max_tokens=6)
        request.lora = None if name is None else adapter(name)
        scheduler.add_request(request)
    lora_of = {f"r{i}": name for i, name in enumerate(names)}
    started: list[str] = []

    def check(so: SchedulerOutput) -> None:
        in_step = {lora_of[r] for r in so.num_scheduled_tokens} - {None}
        assert len(in_step) <= 2, f"{sorted(in_step)} in one step"
        started.extend(new.req_id for new in so.scheduled_new_reqs)
        for new in so.scheduled_new_reqs:
            assert new.lora == (None if lora_of[new.req_id] is None
                                else adapter(lora_of[new.req_id]))

    result = run_to_completion(scheduler, FakeRunner(BS), check=check)
    assert set(result.tokens) == set(lora_of)
    assert started.index("r3") < started.index("r4"), started  # c went before later b/a
    assert started.index("r6") < started.index("r3"), started  # the base model is never held


def test_prefix_cache_keys_on_adapter_content_not_name() -> None:
    request = make_request("r", [1, 2, 3])
    request.lora = LoRAAdapterRef("same-name", "/p", digest="old")
    old = first_block_extra_keys(request)
    request.lora = LoRAAdapterRef("same-name", "/p", digest="new")
    assert first_block_extra_keys(request) != old
    assert "same-name" not in old
