"""A plugin written for a plugin API this core does not provide."""
