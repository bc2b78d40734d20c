"""Entry point of octavo-spec-decode. The proposers register through
``octavo_register_proposers`` as they land; until then this plugin provides no hooks."""
