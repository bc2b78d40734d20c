"""The scheduler side of the engine: ``SchedulerInterface`` and the default ``Scheduler``,
waiting-queue policies, stop checks, and the scheduler side of each feature -
speculative decoding (``spec_decode``), KV transfer (``kv_transfer``), guided decoding
(``structured_outputs``). Imports the features and the layers below; never the worker (the
two share only the plain data of ``octavo.outputs``)."""
