"""Serve checkpoints with vLLM's offline ``LLM`` and score rows by its ``prompt_logprobs``.

Runs inside ``benchmarks/.venv-vllm`` (see ``benchmarks/vllm_env.sh``), started by
``benchmarks/vllm_serving.py`` in a fresh process per checkpoint: vLLM pins its own torch and
transformers, and imports nothing from llmc-trace. Each row is one prompt; its perplexity is
exp(mean NLL) of tokens 1..T-1 given the tokens before them, the rows independent, media
placeholder tokens never scored: the same quantity ``llmc-trace evaluate`` computes.

Rows are a ``.npy`` of token ids (text), or a ``.json`` the caller wrote from llmc-trace's own
processing of image rows: each row's token ids as llmc-trace scores them (every image already
expanded into its placeholder tokens), its images as PNG files, and the placeholder ids. vLLM
gets each prompt with every run of placeholders collapsed to the one marker its processor
expands, and the images as ``multi_modal_data``; the ids vLLM reports back
(``prompt_token_ids``) must be llmc-trace's, token for token, or the worker fails: the scored
sequence is shown identical, not assumed so.

When vLLM refuses a checkpoint the worker reports its error, and the caller reads the log for
the reason. For a piece this machine's vLLM lacks, ``--stand-in`` serves the checkpoint again
with that piece replaced, each replacement narrow enough that vLLM still builds its own model,
creates every parameter with its scheme's shapes and dtypes and loads every tensor through its
own loaders (refusing a missing or misshapen one):

* ``reference-kernel``: no weight-only integer kernel (vLLM's CPU build lacks them on CPUs
  without AVX512). Those layers get a reference kernel that dequantizes the loaded tensors with
  compressed-tensors' own unpacking (``unpack_from_int32``: the format's reference, not
  llmc-trace's writer) and multiplies in the activation dtype, so a reversed packing order
  shows as a wrong perplexity. Widths that do not divide 32 (3, 5, 6, 7 bits) are packed
  densely, value i at bit i x width of the little-endian word stream, as compressed-tensors
  0.20 writes them and vLLM sizes their tensors (32 / width values a word); the
  compressed-tensors vLLM pins (0.17) unpacks whole values per word, so those widths are read
  by :func:`unpack_dense`, the format's definition in a few lines.
* ``pillow-processors``: no torchvision (no CPU build of it here). vLLM's ``llava.py`` imports
  ``pixtral.py``, which imports transformers' torchvision-backed Pixtral image processor for one
  function, ``_num_image_tokens`` (used by Pixtral towers only); transformers' Pillow-backed
  module defines the same function and stands in under the same name. The model class is then
  registered in this process, since vLLM inspects lazily registered classes in a subprocess
  that would not see the stand-in.
* ``clip-names``: transformers 5 saves LLaVA's CLIP tower without CLIPVisionModel's old
  ``vision_model.`` level (``vision_tower.embeddings...``); vLLM 0.32 loads only
  ``vision_tower.vision_model...``. Its own name mapper gains that one level, for weights and
  for the quantization config's ignore list alike; any other unknown name is still refused.

    python serve_vllm.py CHECKPOINT ROWS.npy --rows 16 [--stand-in reference-kernel]
    python serve_vllm.py CHECKPOINT ROWS.json --rows 64 --stand-in pillow-processors

Prints one line ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import traceback

#: Host memory share vLLM's CPU backend may reserve (model and KV cache of a few 512-token rows).
KV_SHARE = 0.15


class ReferenceWNA16Kernel:
    """A weight-only kernel for vLLM's ``CompressedTensorsWNA16`` scheme, in plain torch.

    Takes the place of the kernel ``choose_mp_linear_kernel`` would pick (same constructor
    and methods). After loading it unpacks ``weight_packed`` (and ``weight_zero_point``) with
    compressed-tensors' reference ``unpack_from_int32`` and keeps ``(q - z) * scale`` as a
    dense weight; a forward is one ``F.linear``.
    """

    def __init__(self, config, w_q_param_name, w_s_param_name, w_zp_param_name=None, **_):  # noqa: ANN001
        self.config = config
        self.names = (w_q_param_name, w_s_param_name, w_zp_param_name)

    def process_weights_after_loading(self, layer) -> None:  # noqa: ANN001
        import torch
        from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

        bits = self.config.weight_type.size_bits
        unpack = unpack_from_int32 if 32 % bits == 0 else unpack_dense
        packed_name, scale_name, zero_name = self.names
        columns, rows = self.config.partition_weight_shape  # (in, out)
        shape = torch.Size([rows, columns])
        q = unpack(getattr(layer, packed_name).data, bits, shape, packed_dim=1)
        scale = getattr(layer, scale_name).data.float()
        group = columns // scale.shape[1]
        q = q.float()
        if self.config.zero_points:
            zero_shape = torch.Size([rows, scale.shape[1]])
            zero = unpack(getattr(layer, zero_name).data, bits, zero_shape, packed_dim=0)
            q = q - zero.float().repeat_interleave(group, dim=1)
        weight = q * scale.repeat_interleave(group, dim=1)
        layer.reference_weight = torch.nn.Parameter(
            weight.to(self.config.act_type), requires_grad=False
        )
        for name in self.names:
            if name is not None and hasattr(layer, name):
                delattr(layer, name)

    def apply_weights(self, layer, x, bias=None):  # noqa: ANN001, ANN201
        import torch

        return torch.nn.functional.linear(x, layer.reference_weight, bias)


def unpack_dense(packed, bits: int, shape, packed_dim: int = 1):  # noqa: ANN001, ANN201
    """Signed values of a densely packed int32 tensor: value i of a row (column, for
    ``packed_dim=0``) is bits ``i * bits`` to ``(i + 1) * bits - 1`` of its words read as one
    little-endian bit stream, stored with an offset of ``2 ** (bits - 1)``."""
    import torch

    words = (packed if packed_dim == 1 else packed.t()).to(torch.int64) & 0xFFFFFFFF
    stream = ((words.unsqueeze(-1) >> torch.arange(32)) & 1).reshape(words.shape[0], -1)
    count = shape[packed_dim]
    fields = stream[:, : count * bits].reshape(words.shape[0], count, bits)
    values = (fields << torch.arange(bits)).sum(-1) - (1 << (bits - 1))
    return values if packed_dim == 1 else values.t()


def use_reference_kernel() -> None:
    """Make vLLM's weight-only compressed-tensors scheme use :class:`ReferenceWNA16Kernel`
    (in this process: the engine runs in it, see :func:`score`)."""
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import (
        compressed_tensors_wNa16 as wna16,
    )

    wna16.choose_mp_linear_kernel = lambda config, *args, **kwargs: ReferenceWNA16Kernel


def architecture(checkpoint: str) -> tuple[str, type]:
    """The checkpoint's architecture and vLLM's model class for it, imported in this process."""
    from vllm import ModelRegistry

    with open(os.path.join(checkpoint, "config.json")) as file:
        name = json.load(file)["architectures"][0]
    return name, ModelRegistry.models[name].load_model_cls()


def use_pillow_processors(checkpoint: str) -> None:
    """Let vLLM's model modules import without torchvision (see the module docstring)."""
    import importlib
    import sys

    from vllm import ModelRegistry

    sys.modules["transformers.models.pixtral.image_processing_pixtral"] = importlib.import_module(
        "transformers.models.pixtral.image_processing_pil_pixtral"
    )
    ModelRegistry.register_model(*architecture(checkpoint))


def use_clip_names(checkpoint: str) -> None:
    """Map transformers 5's ``vision_tower.*`` CLIP names to vLLM's
    ``vision_tower.vision_model.*`` (see the module docstring)."""
    import re

    from vllm.model_executor.models.utils import WeightsMapper

    _, model_class = architecture(checkpoint)
    flat = re.compile(r"^(model\.)?vision_tower\.(?!vision_model\.)")
    level = WeightsMapper(orig_to_new_regex={flat: "vision_tower.vision_model."})
    model_class.hf_to_vllm_mapper = level | model_class.hf_to_vllm_mapper


#: ``--stand-in`` names and what installs each; pillow-processors first, the others import the
#: model class.
STAND_INS = {
    "pillow-processors": use_pillow_processors,
    "clip-names": use_clip_names,
    "reference-kernel": lambda checkpoint: use_reference_kernel(),
}


def read_rows(path: str, count: int) -> tuple[list[dict[str, object]], list[int]]:
    """The first ``count`` rows (``token_ids``, ``images``) and the placeholder ids."""
    if path.endswith(".npy"):
        import numpy as np

        ids = np.load(path)[:count].astype(int).tolist()
        return [{"token_ids": row, "images": []} for row in ids], []
    with open(path) as file:
        table = json.load(file)
    return table["rows"][:count], table["placeholder_ids"]


def score(
    checkpoint: str, rows: list[dict[str, object]], placeholders: list[int], stand_ins: list[str]
) -> dict[str, object]:
    # engine and worker in this process: a kernel patched here is the one used, and starting
    # takes seconds instead of half a minute (no engine and worker processes to spawn)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    for name in STAND_INS:
        if name in stand_ins:
            STAND_INS[name](checkpoint)
    from vllm import LLM

    images = max(len(row["images"]) for row in rows)
    start = time.perf_counter()
    llm = LLM(
        model=checkpoint,
        tokenizer=checkpoint,
        dtype="auto",
        max_model_len=max(len(row["token_ids"]) for row in rows) + 1,  # and the generated one
        enforce_eager=True,
        seed=0,
        # on the CPU backend this is the share of host memory vLLM reserves for itself; its
        # default (0.92) refuses to start beside anything else. The KV cache needs far less.
        gpu_memory_utilization=KV_SHARE,
        distributed_executor_backend="uni",
        **({"limit_mm_per_prompt": {"image": images}} if images else {}),
    )
    try:
        return _score(llm, rows, placeholders, time.perf_counter() - start)
    finally:
        llm.llm_engine.engine_core.shutdown()  # else its processes outlive this one


def vllm_prompt(row: dict[str, object], placeholders: list[int]) -> dict[str, object]:
    """Row's prompt as vLLM takes it: its placeholders collapsed (vLLM's processor expands them
    again), the images as ``multi_modal_data``."""
    from PIL import Image
    from vllm.inputs import TokensPrompt

    ids = collapse_placeholders(row["token_ids"], placeholders)
    if not row["images"]:
        return TokensPrompt(prompt_token_ids=ids)
    pictures = []
    for path in row["images"]:
        with Image.open(path) as image:
            pictures.append(image.convert("RGB"))
    return TokensPrompt(prompt_token_ids=ids, multi_modal_data={"image": pictures})


def collapse_placeholders(ids: list[int], placeholders: list[int]) -> list[int]:
    """``ids`` with each run of one placeholder id cut to a single token: the marker standing
    for one image before the processor expands it."""
    collapsed: list[int] = []
    for token in ids:
        if not (token in placeholders and collapsed and collapsed[-1] == token):
            collapsed.append(token)
    return collapsed


def _score(llm, rows: list[dict[str, object]], placeholders: list[int], load_s: float):  # noqa: ANN001, ANN201
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
    prompts = [vllm_prompt(row, placeholders) for row in rows]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    score_s = time.perf_counter() - start
    nll, count = 0.0, 0
    for index, (row, output) in enumerate(zip(rows, outputs)):
        ours, theirs = row["token_ids"], list(output.prompt_token_ids)
        if theirs != ours:
            raise RuntimeError(f"row {index}: {token_difference(ours, theirs)}")
        for position, logprobs in enumerate(output.prompt_logprobs):
            if position == 0 or ours[position] in placeholders:
                continue  # the first token has no context; placeholders are not predicted
            nll -= logprobs[ours[position]].logprob
            count += 1
    return {
        "perplexity": math.exp(nll / count),
        "scored_tokens": count,
        "load_s": load_s,
        "tokens_per_s": sum(len(row["token_ids"]) for row in rows) / score_s,
    }


def token_difference(ours: list[int], theirs: list[int]) -> str:
    """Where vLLM's prompt tokens leave llmc-trace's."""
    at = next(
        (i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs))
    )
    return (
        f"vLLM's prompt is not llmc-trace's: {len(theirs)} tokens against {len(ours)}, first "
        f"difference at position {at} (ours {ours[at : at + 4]}, vLLM's {theirs[at : at + 4]})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("rows", help=".npy token ids, one prompt per row, or .json media rows")
    parser.add_argument("--rows", type=int, default=16, dest="count")
    parser.add_argument(
        "--stand-in", action="append", default=[], choices=sorted(STAND_INS),
        help="replace a piece this machine's vLLM lacks (repeatable)",
    )  # fmt: skip
    args = parser.parse_args()
    rows, placeholders = read_rows(args.rows, args.count)
    try:
        result: dict[str, object] = {
            "ok": True,
            **score(args.checkpoint, rows, placeholders, args.stand_in),
        }
    except Exception as err:  # noqa: BLE001 - the report is the point: say what vLLM said
        text = "".join(traceback.format_exception(err))
        result = {
            "ok": False,
            "error": f"{type(err).__name__}: {err}"[:500],
            "trace_tail": text[-1500:],
        }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
