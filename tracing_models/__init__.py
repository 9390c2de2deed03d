"""Traceable definitions of model classes that no automatic fix makes traceable.

One module per architecture; each defines a subclass of the model class that overrides only
the methods that do not trace, written as a small diff against its base (as transformers'
``modular_*.py`` files are), and decorates it with :func:`register`. ``llmc-trace attempt
--fix`` tries a definition last, after opaque calls and autowrap, and accepts it only if the
subgraphs replayed afterwards equal the original model's eager forward on the same weights.
How to add one: ``tracing_models/README.md``. The machinery is
:mod:`llmc_trace.tracing.definitions`.

One definition ships: ``rwkv`` (RWKV's forward rescales its own weights in place, which
no graph can hold); autowrap fixes every other built-in architecture that needed a fix.
"""

from llmc_trace.tracing.definitions import REGISTRY, register, unregister

__all__ = ["REGISTRY", "register", "unregister"]
