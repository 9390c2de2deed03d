"""One warning for a renamed Python name: the old one keeps working for one release.

A keyword, method or attribute renamed in the public API is still accepted for one release,
with a :class:`DeprecationWarning` that names its replacement, so a caller's code runs
unchanged while saying what to write instead; the next release removes it.
"""

from __future__ import annotations

import warnings


def renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated and removed in the next release, and to use ``new``;
    ``stacklevel`` 3 points at the caller of the function that calls this."""
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release; use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
