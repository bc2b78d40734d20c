"""``octavo spec train``: self-distillation of Medusa and EAGLE heads from a target model.

The target writes its own training text (greedy replies to the instructions in
``prompts.py`` and to requests it writes itself, ``self_instruct.py``), a plain
full-sequence forward of the same model gives its features, and the heads learn to predict
what the target will say next. Greedy text is what speculative
verification checks drafts against, so it is exactly the distribution to fit.
"""
