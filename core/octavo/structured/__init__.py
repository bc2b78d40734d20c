"""Guided decoding, the part both sides share: grammars built with xgrammar from a request's
``StructuredOutputsParams`` (``grammar``: the front end validates with it) and compiled
against the tokenizer on worker threads, cached by constraint (``cache``). The scheduler
side (each request's matcher, the step's bitmask) is ``octavo.sched.structured_outputs``;
the worker side (masking the logits) ``octavo.worker.grammar_bitmask``. Imports xgrammar,
the config and the plain data only."""
