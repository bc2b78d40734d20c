"""Model loaders: an HF folder (config.json + safetensors) or a GGUF file, as ModelFiles.
Imports the plain data (the cache folder) only."""

from octavo.models.loader.default_model import default_model_path
from octavo.models.loader.errors import ModelLoadError
from octavo.models.loader.files import ModelFiles
from octavo.models.loader.load import load_model_files

__all__ = ["ModelFiles", "ModelLoadError", "default_model_path", "load_model_files"]
