"""An example third-party Octavo plugin (see docs/plugins.md)."""
