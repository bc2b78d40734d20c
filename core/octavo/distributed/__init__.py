"""Where this process sits among the workers of one engine (tensor and pipeline ranks),
and the collectives the model layers use between them (``octavo.distributed.state``)."""
