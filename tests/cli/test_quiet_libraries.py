"""A command's display is its own: transformers' deprecation warnings stay off it unless the
user's environment asks for transformers' messages."""

from __future__ import annotations

import warnings

import pytest
import transformers
from transformers import LlamaConfig

from llmc_trace.cli.quiet_libraries import quiet_libraries


def transformers_future_warnings(*, quiet: bool = True) -> list[str]:
    """What transformers warns when its own code sets the ``rope_scaling`` it deprecates (as
    Fuyu's model does), with the filters a command installs (``quiet``) or none."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        if quiet:
            quiet_libraries()
        LlamaConfig().rope_scaling = {"rope_type": "default", "rope_theta": 10000.0}
    return [str(w.message) for w in seen if issubclass(w.category, FutureWarning)]


@pytest.mark.skipif(
    not transformers_future_warnings(quiet=False),
    reason=f"transformers {transformers.__version__} does not deprecate rope_scaling",
)
@pytest.mark.parametrize("verbosity", [None, "warning"])
def test_transformers_deprecations_show_only_when_its_verbosity_asks(
    monkeypatch: pytest.MonkeyPatch, verbosity: str | None
) -> None:
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", verbosity or "unset")
    if verbosity is None:
        monkeypatch.delenv("TRANSFORMERS_VERBOSITY")
    shown = transformers_future_warnings()
    if verbosity is None:
        assert shown == []
    else:
        assert any("`rope_scaling` is deprecated" in message for message in shown), shown
