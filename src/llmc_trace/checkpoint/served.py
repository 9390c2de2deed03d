"""Projections a server runs as one fused layer, which a checkpoint must keep in one scheme.

vLLM loads ``q_proj``, ``k_proj`` and ``v_proj`` of an attention block into one ``qkv_proj``
(its models' ``packed_modules_mapping``), ``gate_proj`` and ``up_proj`` into one
``gate_up_proj``, and refuses a checkpoint whose parts of such a layer differ in scheme
("Found different quantization schemes for the shards of ... vLLM requires all to use the same
scheme"). transformers loads either. So a layer kept in full precision brings its fused
siblings along: :func:`served_together` names them, for ``--ignore`` and for the report's
suggestions.
"""

from __future__ import annotations

from collections.abc import Collection

#: Sibling projections (by their last name) that vLLM fuses into one layer.
FUSED_IN_SERVING: tuple[frozenset[str], ...] = (
    frozenset({"q_proj", "k_proj", "v_proj"}),
    frozenset({"gate_proj", "up_proj"}),
    frozenset({"w1", "w3"}),  # Mixtral-style experts' gate and up
    frozenset({"q_a_proj", "kv_a_proj_with_mqa"}),  # DeepSeek's MLA down-projections
)


def served_together(name: str, names: Collection[str]) -> list[str]:
    """``name`` and the layers of ``names`` fused with it in serving, in the order of
    ``names`` (``name`` alone where it is fused with none of them)."""
    parent, _, last = name.rpartition(".")
    group = next((g for g in FUSED_IN_SERVING if last in g), None)
    if group is None:
        return [name]
    prefix = f"{parent}." if parent else ""
    siblings = {f"{prefix}{sibling}" for sibling in group}
    together = [n for n in names if n in siblings]
    return together if name in together else [name, *together]
