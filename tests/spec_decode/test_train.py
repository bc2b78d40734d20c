"""``octavo spec train`` end to end on a tiny random model: it runs in seconds, writes the
published layout, the heads load, and the same seed gives the same heads."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from octavo import LLM
from octavo.attention.torch_backend import TorchAttentionBackend
from octavo_spec_decode.eagle import load_eagle
from octavo_spec_decode.medusa import load_medusa
from octavo_spec_decode.train.data import Sequence, add_features, generate_text, load_target
from octavo_spec_decode.train.medusa_train import (
    distillation_loss,
    medusa_examples,
    train_medusa,
)
from octavo_spec_decode.train.prompts import HELD_OUT_PROMPTS, training_prompts
from octavo_spec_decode.train.run import TrainOptions, train_heads
from octavo_spec_decode.train.self_instruct import self_written_requests, user_turn_prefix
from octavo_spec_decode.train.targets import TokenSubset, label_tokens, on_greedy_path
from tests.core.tiny_models import VOCAB_SIZE
from tests.helpers import run_octavo


def train(method: str, target: Path, out: Path) -> str:
    result = run_octavo("spec", "train", "--method", method, "--model", str(target),
                        "--out", str(out), "--steps", "4", "--prompts", "4", "--self-written", "2",
                        "--max-tokens", "12", "--seed", "3", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_spec_train_cli_writes_an_eagle_head_that_loads(target: Path, tmp_path: Path) -> None:
    report = train("eagle", target, tmp_path)
    assert "written to" in report and "tokens per verification step" in report, report
    model = load_target(str(target))[0]
    load_eagle(tmp_path, TorchAttentionBackend, model.model.embed_tokens,
               model.config.hidden_size)


def test_spec_train_reports_bad_input_without_a_traceback(target: Path, tmp_path: Path,
                                                          ) -> None:
    """What the user can fix is one line naming the option or file, not a Python trace."""
    too_many = run_octavo("spec", "train", "--method", "medusa", "--model", str(target),
                          "--out", str(tmp_path / "out"), "--prompts", "5000", timeout=300)
    assert too_many.returncode != 0
    assert "--prompts 5000: only" in too_many.stderr and "Traceback" not in too_many.stderr
    torch.save({"model": "another-model", "sequences": []}, tmp_path / "data.pt")
    other = run_octavo("spec", "train", "--method", "medusa", "--model", str(target),
                       "--out", str(tmp_path / "out"), "--data", str(tmp_path / "data.pt"),
                       timeout=300)
    assert other.returncode != 0
    assert "holds data of model 'another-model'" in other.stderr
    assert "Traceback" not in other.stderr


def test_medusa_training_is_deterministic_and_loads(target: Path, tmp_path: Path) -> None:
    def options(out: Path, evaluate: bool) -> TrainOptions:
        return TrainOptions(method="medusa", model=str(target), out=str(out), steps=4,
                            num_prompts=4, self_written=2, max_tokens=12, seed=3,
                            evaluate=evaluate,
                            data=str(tmp_path / "data.pt"))

    report = train_heads(options(tmp_path / "a", evaluate=True))
    assert "tokens per verification step" in report, report
    assert "tree [[0], [1], [2], [0, 0], [1, 0], [0, 0, 0]]" in report, report
    assert (tmp_path / "data.pt").is_file()
    train_heads(options(tmp_path / "b", evaluate=False))  # reuses the text and features
    model = load_target(str(target))[0]
    heads = load_medusa(tmp_path / "a", model.config.hidden_size, VOCAB_SIZE)
    assert len(heads) == 3
    # The vocabulary projections stay the target's LM head (frozen in training).
    assert all(torch.equal(w, model.lm_head.weight) for w in heads.projections())
    first = load_file(tmp_path / "a" / "medusa_lm_head.safetensors")
    second = load_file(tmp_path / "b" / "medusa_lm_head.safetensors")
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


def test_medusa_distillation_learns_the_targets_later_distributions(target: Path) -> None:
    """The heads' loss against the target's own distributions at t + 2.. comes down towards
    its floor (the distributions' entropy; a random tiny target's are nearly flat) from where
    identity ResBlocks start (each head guessing the next token's distribution)."""
    sequences = generate_text(str(target), training_prompts()[:6], 24, seed=1)
    model = load_target(str(target))[0]
    add_features(model, sequences)
    lm_head = model.lm_head.weight
    examples = medusa_examples(sequences, 3)
    subset_lm_head = lm_head[TokenSubset.of(sequences, VOCAB_SIZE).token_ids]
    batch = torch.arange(len(examples.rows))
    floor = torch.tensor(0.0)
    for i in range(3):
        rows = examples.teacher_rows[:, i][examples.teacher_rows[:, i] >= 0]
        probs = torch.softmax(examples.features[rows] @ subset_lm_head.T, dim=-1)
        floor += 0.8 ** i * -(probs * probs.log()).sum(-1).mean()

    def excess(steps: int) -> float:
        heads = train_medusa(sequences, lm_head, 3, 1, steps=steps, seed=0)
        return (distillation_loss(heads, examples, batch, subset_lm_head) - floor).item()

    before, after = excess(1), excess(200)
    assert after < 0.6 * before, (before, after)


def test_labels_are_the_targets_greedy_picks(target: Path) -> None:
    """On a greedy reply the recorded picks are the reply itself (the dense feature pass
    agrees with the engine); a sampled reply keeps the greedy picks as its labels."""
    model = load_target(str(target))[0]
    prompts = training_prompts()[:4]
    sequences = generate_text(str(target), prompts, max_tokens=10, seed=5,
                              samples_per_prompt=1)
    assert len(sequences) == 2 * len(prompts)  # greedy replies first, then sampled ones
    add_features(model, sequences)
    for seq in sequences[:len(prompts)]:
        start = seq.num_prompt_tokens
        assert torch.equal(seq.next_tokens[start - 1:-1], seq.token_ids[start:])
    for seq in sequences:
        labels = label_tokens(seq, 2)
        assert torch.equal(labels[:-1], seq.next_tokens[1:])


def test_on_greedy_path_matches_a_direct_count(seed: int) -> None:
    """Positions whose next ``span`` tokens all equal the target's greedy picks, against a
    plain loop, on text that leaves the greedy path at random places."""
    gen = torch.Generator().manual_seed(seed)
    token_ids = torch.randint(0, 5, (40,), generator=gen)
    next_tokens = torch.cat([token_ids[1:], torch.tensor([0])])  # greedy text ...
    off = torch.rand(40, generator=gen) < 0.3  # ... except where sampling drew another token
    next_tokens[off] = (next_tokens[off] + 1) % 5
    seq = Sequence(token_ids, 3, next_tokens=next_tokens)
    for span in (1, 2, 3):
        expected = [t + span < 40 and all(int(token_ids[t + i]) == int(next_tokens[t + i - 1])
                                          for i in range(1, span + 1)) for t in range(40)]
        assert on_greedy_path(seq, span).tolist() == expected, f"seed={seed} span={span}"


def test_training_prompts_are_distinct_and_hold_out_the_benchmark_instructions() -> None:
    prompts = training_prompts()
    assert len(set(prompts)) == len(prompts) >= 576  # the default --prompts
    assert not set(prompts) & set(HELD_OUT_PROMPTS)


def test_user_turn_prefix_is_the_template_up_to_the_message(target: Path) -> None:
    tokenizer = LLM(model=str(target), dtype="float32").get_tokenizer()
    prefix = user_turn_prefix(tokenizer)
    whole = tokenizer.apply_chat_template([{"role": "user", "content": "Hello there"}],
                                          tokenize=True, return_dict=False)
    assert prefix and list(whole[:len(prefix)]) == prefix
    assert tokenizer.decode(whole[len(prefix):]).startswith("Hello there")


def test_self_written_requests_are_distinct_ended_turns(target: Path, seed: int) -> None:
    """The target's own user turns: only ones it ended itself, no repeats, none excluded,
    and the same seed gives the same list."""
    llm = LLM(model=str(target), dtype="float32", seed=seed)
    first = self_written_requests(llm, 6, seed)
    assert 0 < len(first) <= 6 and len(set(first)) == len(first)
    assert all(r and r == r.strip() for r in first)
    assert self_written_requests(llm, 6, seed) == first
    without = self_written_requests(llm, 6, seed, exclude=(first[0],))
    assert first[0] not in without and set(first[1:]) <= set(without)
