"""RWKV: rescale the weights once, eagerly, instead of recording the write in the graph.

``RwkvModel.forward`` calls ``_rescale_layers`` on its first eval call: it divides each
block's ``attention.output`` and ``feed_forward.value`` weights *in place* by
``2 ** (block // rescale_every)`` and from then on halves the hidden state after every
``rescale_every`` blocks (keeping fp16 activations from overflowing). Traced as it is, the
write lands in the graph and a calibration pass would divide the weights again on every
batch. Skipping it is not an option either: the layer norms' epsilon makes the rescaled model
compute slightly different numbers, and calibration must see the numbers inference sees.

So the definition does what the original does on its first call, once, on the real tensors
(``_parameters`` is read directly, so the tracer records nothing), and the graph keeps the
halving, which the original ``forward`` decides from the concrete ``layers_are_rescaled``.

The weights stay rescaled afterwards, as after any eval call of the original. A checkpoint
must store them un-rescaled (loading rescales them again), so a definition that changes
weights says so with ``changes_weights`` and ``compress`` refuses the model.
"""

from __future__ import annotations

import torch
from transformers.models.rwkv.modeling_rwkv import RwkvModel

from tracing_models import register


@register
class TraceableRwkvModel(RwkvModel):
    """RwkvModel whose weight rescaling runs eagerly, outside the graph."""

    changes_weights = True

    def _rescale_layers(self) -> None:
        if self.layers_are_rescaled or self.training or self.config.rescale_every <= 0:
            return
        with torch.no_grad():
            for block_id, block in enumerate(self.blocks):
                factor = 2 ** (block_id // self.config.rescale_every)
                for linear in (block.attention.output, block.feed_forward.value):
                    linear._parameters["weight"].div_(factor)
        self.layers_are_rescaled = True
