"""The worker side of speculative decoding: the ``Proposer`` interface that plugins
implement (with ``ProposeInputs`` and ``ProposerContext``), the verifier that checks a step's
drafts against the target with the rejection sampler and asks the proposer for the next
ones, and the helpers draft models use to build their own steps. Imports the worker's step
inputs and input batch, the shared speculative parts (``octavo.spec_decode``), sampling, models,
attention, config and the plain data; never the scheduler."""
