"""Classes with no forward that a calibration can run on its own: ``coverage --all`` lists
them apart, neither verified nor as types transformers cannot run.

transformers has two kinds, each read off the class (never a list of names):

* a wrapper that only generates: its ``forward`` is ``nn.Module``'s own, unimplemented
  (Qwen2.5-Omni and Qwen3-Omni as a whole: ``generate`` runs the thinker, then the talker and
  the vocoder, which are model types of their own and swept as such);
* a draft model for assisted generation, whose forward reads the key/value states the main
  model computed (:data:`MAIN_MODEL_STATES`; the Gemma 4 assistants): no sample of its own
  stands in for another model's states, and it is calibrated, if at all, beside that model.
"""

from __future__ import annotations

import inspect

import torch
from transformers import PreTrainedModel

#: The forward parameter through which a draft model reads its main model's key/value states.
MAIN_MODEL_STATES = "shared_kv_states"


def not_standalone(cls: type[PreTrainedModel]) -> str | None:
    """Why ``cls`` has no forward a calibration can run on its own, or ``None`` if it has one."""
    if cls.forward is torch.nn.Module.forward:
        return (
            f"{cls.__name__} has no forward: it only generates, through sub-models that are "
            "model types of their own"
        )
    if MAIN_MODEL_STATES in inspect.signature(cls.forward).parameters:
        return (
            f"{cls.__name__} is a draft model for assisted generation: its forward reads the "
            f"main model's key/value states ({MAIN_MODEL_STATES})"
        )
    return None
