"""The one error every loader raises for bad model input."""


class ModelLoadError(ValueError):
    """A model path, file or its content cannot be loaded; the message names the file and why."""
