"""Which part of a model each module belongs to: language model, vision or audio tower,
projector, head.

A vision-language model is compressed the way its served checkpoints are: the language model's
linear layers quantized, the towers and the projector that feeds their output to the language
model kept in full precision (they are small next to the decoder, often have widths no group
size divides, and lose more accuracy per weight). Which modules those are is read from the
model's own structure, not from name patterns that every new architecture breaks
(``visual``, ``vision_tower``, ``vision_model``, ``audio_tower``, ...): transformers names a
model's modality encoders (:meth:`~transformers.PreTrainedModel.get_encoder` with a modality)
and its decoder (:meth:`~transformers.PreTrainedModel.get_decoder`). Whatever sits outside
those and outside the output head is the *projector* (LLaVA's ``multi_modal_projector``,
Idefics3's ``connector``), and so is a tower's own last stage that maps into the language
model's width (Qwen2-VL's ``visual.merger``), told by its name.

A text-only model is all language model, its output head aside.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

LANGUAGE_MODEL = "language model"
VISION_TOWER = "vision tower"
AUDIO_TOWER = "audio tower"
PROJECTOR = "projector"
HEAD = "head"
#: The parts kept in full precision unless the run asks for the towers too.
TOWER_PARTS = (VISION_TOWER, AUDIO_TOWER, PROJECTOR)

#: A tower's submodule that maps its features into the language model's width is the
#: projector, wherever the architecture put it (Qwen2-VL: ``visual.merger``).
_PROJECTOR_WORDS = ("merger", "projector", "connector", "projection")
_TOWERS = {"image": VISION_TOWER, "audio": AUDIO_TOWER}


@dataclass(frozen=True)
class ModelParts:
    """The module path prefixes of each part of one model (longest prefix decides)."""

    prefixes: dict[str, str]
    """Module path -> part; ``""`` (the whole model) maps to the part of what is not claimed."""

    @property
    def multimodal(self) -> bool:
        return any(part in TOWER_PARTS for part in self.prefixes.values())

    def part_of(self, name: str) -> str:
        """The part the module at ``name`` belongs to."""
        best = ""
        for prefix in self.prefixes:
            if len(prefix) > len(best) and (name == prefix or name.startswith(prefix + ".")):
                best = prefix
        return self.prefixes[best]

    def in_towers(self, names: Iterable[str]) -> list[str]:
        """Those of ``names`` that belong to a tower or a projector."""
        return [name for name in names if self.part_of(name) in TOWER_PARTS]


def model_parts(model: torch.nn.Module) -> ModelParts:
    """The parts of ``model`` (see the module docstring); any ``nn.Module`` works, a plain one
    being all language model."""
    paths = {id(module): name for name, module in model.named_modules()}
    prefixes: dict[str, str] = {}
    towers = []
    for modality, part in _TOWERS.items():
        encoder = _call(model, "get_encoder", modality)
        path = paths.get(id(encoder))
        if path:  # the model itself comes back when it has no such encoder
            prefixes[path] = part
            towers.append(encoder)
    for tower in towers:
        for name, _ in tower.named_children():
            if any(word in name for word in _PROJECTOR_WORDS):
                prefixes[f"{paths[id(tower)]}.{name}"] = PROJECTOR
    head = _call(model, "get_output_embeddings")
    if paths.get(id(head)):
        prefixes[paths[id(head)]] = HEAD
    if not towers:
        prefixes[""] = LANGUAGE_MODEL
        return ModelParts(prefixes)
    decoder = _call(model, "get_decoder")
    if paths.get(id(decoder)):
        prefixes[paths[id(decoder)]] = LANGUAGE_MODEL
    prefixes[""] = PROJECTOR  # between the towers and the decoder: what connects them
    for name, module in model.named_modules():
        # the embeddings of a model whose decoder does not hold them stay language model
        if isinstance(module, torch.nn.Embedding) and not _claimed(prefixes, name):
            prefixes[name] = LANGUAGE_MODEL
    return ModelParts(prefixes)


def _call(model: torch.nn.Module, method: str, *args: str) -> object:
    """``model.method(*args)``, or ``None`` for a module without it or one whose lookup
    raises (a few architectures raise instead of returning the model itself)."""
    function = getattr(model, method, None)
    if function is None:
        return None
    try:
        return function(*args)
    except (AttributeError, NotImplementedError, ValueError, TypeError):
        return None


def _claimed(prefixes: dict[str, str], name: str) -> bool:
    return any(p and (name == p or name.startswith(p + ".")) for p in prefixes)
