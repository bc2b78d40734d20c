"""Defaults of ``octavo spec train``, in a module of their own so that the command's help
can show them without importing torch or the training code when ``octavo`` starts."""

from __future__ import annotations

# Greedy replies to this many built-in prompts: the first 288 cover 40 topics, the rest 40
# more topics and 5 more kinds of request.
NUM_PROMPTS = 576
# Requests the target writes itself (``self_instruct.py``), answered like the built-in ones.
# Built-in prompts alone overfit the heads to their topics; these are what carry the heads
# to new prompts. Writing and answering them is most of the generation's time (~35 min on
# 2 cores for the defaults); ``--data`` keeps the result for the other method.
SELF_WRITTEN = 2500
# Optimizer steps (EAGLE: 8 replies a step, ~1.5 s on one core, about 2.3 passes over the
# default text; Medusa: 256 positions a step, ~0.6 s, about one pass - its distillation
# loss has settled by then). The varied text has ~3x the distinct tokens of the built-in
# replies, and the logits over them are most of a step. EAGLE-3: 8 replies a step as EAGLE,
# 3 unrolled drafting steps each plus the target's distributions - about 2.3x an EAGLE step
# (measured side by side on SmolLM2-135M, one thread; ~4 s on one core).
STEPS = {"medusa": 1500, "eagle": 800, "eagle3": 800}
# ResBlocks per Medusa head (Medusa-1's one).
MEDUSA_LAYERS = 1
# The token tree Medusa heads are measured with besides the plain chain (paths deeper than
# the heads are dropped): the first head's three best candidates, the second head's best
# after each of the first two, the third head's after the all-best path. On the default
# heads: 1.47 tokens per step at k = 3 on the held-out prompts, against 1.32 as a chain.
MEDUSA_TREE = ((0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0))
