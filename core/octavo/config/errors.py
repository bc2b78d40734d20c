"""``ConfigError``: the one exception every configuration problem raises."""


class ConfigError(ValueError):
    """An engine setting is out of range, inconsistent or names nothing registered; the
    message names the setting."""
