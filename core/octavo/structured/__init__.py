"""Guided decoding: grammars compiled with xgrammar from a request's
``StructuredOutputsParams`` (``octavo.sampling_params``), cached by their spec, and the
manager that advances each constrained request's matcher and fills the step's bitmask.
Imported only where constraints are built: it pulls in xgrammar."""
