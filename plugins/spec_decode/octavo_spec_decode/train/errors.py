"""The one error ``octavo spec train`` reports as a plain message, not a traceback.

Raised for what the user can fix (an option out of range, a ``--data`` file of another
model, a chat template the target cannot write requests from); any other exception is a bug
and keeps its traceback. Torch-free, so the CLI can catch it without loading training code.
"""


class TrainingInputError(ValueError):
    """Bad input to ``octavo spec train``; the message names the option or file."""
