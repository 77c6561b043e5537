"""The verl adapter's one exception class, shared by impl.py and loss.py (so neither imports the other's
module for it)."""

from __future__ import annotations

from ..base import Unsupported


class ParamUnsupported(Unsupported, NotImplementedError):
    """The case asks for a parameter value that verl 0.9.1 cannot be configured to.

    Golden cases outside verl's domain are declared not-applicable (deviations.toml, [[capability]])
    and never reach the adapter; the property checks build their own examples, and for those this
    exception (a ``properties.Unsupported``) reports the row as unsupported."""
