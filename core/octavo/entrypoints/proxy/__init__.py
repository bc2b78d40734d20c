"""``octavo proxy``: the front of a disaggregated deployment - prefill instances compute
prompts (their KV goes out through a KV connector), decode instances load it and generate.
Talks HTTP to servers; imports nothing of the engine."""
