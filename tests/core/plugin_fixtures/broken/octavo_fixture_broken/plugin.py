"""A plugin whose import fails: the core must skip it and keep working."""

raise RuntimeError("octavo-fixture-broken is deliberately broken")
