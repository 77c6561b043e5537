"""The OAT adapter's exception class, shared by __init__.py and head.py (so head.py does not import the
package that imports it)."""

from __future__ import annotations

from pgspec.adapters.base import Unsupported as _Unsupported


class UnsupportedParameter(_Unsupported, NotImplementedError):
    """A parameter value or input form OAT cannot express (declared as a capability in deviations.toml)."""
