"""Entry point of octavo-connectors. The connectors register through
``octavo_register_kv_connectors`` as they land; until then this plugin provides no hooks."""
