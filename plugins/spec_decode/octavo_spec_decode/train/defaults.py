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
# Optimizer steps: about 2.3 passes over the default text for each method (EAGLE: 8
# replies a step, ~1.5 s on one core; Medusa: 256 positions a step, ~0.4 s). The varied
# text has ~3x the distinct tokens of the built-in replies, and the logits over them are
# most of a step.
STEPS = {"medusa": 4000, "eagle": 800}
# ResBlocks per Medusa head (Medusa-1's one).
MEDUSA_LAYERS = 1
