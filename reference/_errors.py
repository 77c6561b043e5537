"""The one exception the reference raises for bad input."""


class SpecError(ValueError):
    """Bad input to a formula: the message names the argument, what was expected and what was given."""
