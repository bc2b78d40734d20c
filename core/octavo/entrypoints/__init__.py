"""The entrypoints: the click CLI (``octavo serve|generate|chat|plugins|proxy|bench``), the
OpenAI-compatible server and the P/D proxy. The top of the core with ``bench``: imports the
engine and everything below; engine flags come from the config's fields."""
