"""Write a compressed model as a compressed-tensors checkpoint folder that vLLM and transformers load.

The folder holds `config.json` (the model's config plus `quantization_config`), one
`model.safetensors`, `generation_config.json` when the model has one, `recipe.yaml` when a
recipe is given, and the tokenizer files of a source folder when one is given. It is written
into a hidden temporary folder beside the target and renamed into place only when complete, so
an interrupted write never leaves a half-written checkpoint under the target's name.

Loading it back needs compressed-tensors installed and nothing else:
`AutoModelForCausalLM.from_pretrained(folder)` decompresses the weights on the first forward
pass (on CPU too; no `run_compressed=False` is needed), and
`from_pretrained(folder, quantization_config=CompressedTensorsConfig(dequantize=True))`
(`transformers.utils.quantization_config`) decompresses them while loading.

Two limits of today's loaders, not of the files: an asymmetric `pack-quantized` checkpoint
(W4A16_ASYM) loads through transformers only with `dequantize=True`, because compressed-tensors
0.20 prepares compressed modules without packing their zero points (its own checkpoints fail
the same way; llm-compressor issue #1618). And a W8A8 (`int-quantized`) model loaded compressed
also rounds its input activations per token, as vLLM does, so its logits differ from those of
the weight-only fake-quantized model by that activation rounding.

Tensor names are the paths of `model.state_dict()`, which are the checkpoint names for
decoder-only models such as Llama, Qwen or Mistral; models that transformers saves under other
names (its conversion mappings for some multimodal models) are not handled. Everything goes
into a single safetensors file, not shards.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from llmc_trace.checkpoint.layout import ignored_modules, module_tensors, quantization_config
from llmc_trace.checkpoint.recipe import Recipe, render_recipe
from llmc_trace.errors import CheckpointError, OutputError
from llmc_trace.compress.quantize import QuantizedWeight
from llmc_trace.compress.scheme import DEFAULT_SCHEME, QuantizationScheme, matches
from llmc_trace.compress.sparsegpt import Sparsity

TOKENIZER_FILES = (
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "merges.txt",
    "preprocessor_config.json",
    "processor_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "vocab.json",
)
"""Files copied from `tokenizer_dir` when present: tokenizers, chat templates, processors."""


@dataclass(frozen=True)
class SparsityInfo:
    """Which modules were pruned, and to what structure (0.5, or (2, 4) for 2:4)."""

    structure: Sparsity
    modules: tuple[str, ...]


def save_compressed(
    model: torch.nn.Module,
    out_dir: str | Path,
    quantized: Mapping[str, QuantizedWeight],
    schemes: Sequence[QuantizationScheme] = (DEFAULT_SCHEME,),
    *,
    sparsity: SparsityInfo | None = None,
    recipe: Recipe | None = None,
    tokenizer_dir: str | Path | None = None,
    overwrite: bool = False,
) -> Path:
    """Write `model` with the modules in `quantized` stored as integers; return the folder.

    `quantized` maps module paths to their `QuantizedWeight`; each must be targeted by exactly
    one of `schemes` (by `targets` alone) and use that scheme's weight arguments, and its scales
    must be in the model's dtype, so that the stored integers dequantize exactly to the weight
    they were computed from. Every other tensor, including pruned but unquantized weights, is
    written as it is in `model`. With `sparsity`, the config states the structure and the
    measured sparsity of those modules; their weights stay dense (see
    `llmc_trace.checkpoint.layout.quantization_config` for why).

    An existing `out_dir` is an error unless `overwrite`, in which case it is replaced only once
    the new folder is complete.

    >>> import tempfile
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from llmc_trace.compress import W4A16, rtn
    >>> config = LlamaConfig(
    ...     hidden_size=128, intermediate_size=256, num_hidden_layers=1,
    ...     num_attention_heads=2, num_key_value_heads=2, vocab_size=64,
    ... )
    >>> model = LlamaForCausalLM(config)
    >>> quantized = {
    ...     name: rtn(module.weight.data, W4A16.weights)
    ...     for name, module in model.named_modules()
    ...     if W4A16.is_target(name, module)
    ... }
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     folder = save_compressed(model, Path(tmp) / "tiny-w4a16", quantized)
    ...     sorted(path.name for path in folder.iterdir())
    ['config.json', 'generation_config.json', 'model.safetensors']
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise CheckpointError(
            "the output folder already exists.",
            hint="choose another folder, or pass overwrite=True to replace it.",
            location=str(out_dir),
        )
    config = getattr(model, "config", None)
    if config is None:
        raise CheckpointError(
            "the model has no `config`; a checkpoint needs one for config.json.",
            hint="pass a transformers PreTrainedModel.",
        )
    dtype = _model_dtype(model)
    assignment = _assign_schemes(model, quantized, schemes, dtype)
    used = [scheme for scheme in schemes if scheme in assignment.values()]
    tensors = _checkpoint_tensors(model, quantized, assignment)

    config_dict = config.to_diff_dict()
    config_dict["dtype"] = str(dtype).removeprefix("torch.")
    if used or sparsity is not None:
        measured = None
        if sparsity is not None:
            measured = (sparsity.structure, _global_sparsity(model, quantized, sparsity.modules))
        ignore = ignored_modules(model, used, quantized)
        config_dict["quantization_config"] = quantization_config(used, ignore, measured)
    generation_config = getattr(model, "generation_config", None)

    def write(folder: Path) -> None:
        (folder / "config.json").write_text(
            json.dumps(config_dict, indent=2, sort_keys=True) + "\n"
        )
        if generation_config is not None:
            generation_config.to_json_file(folder / "generation_config.json", use_diff=True)
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        if recipe is not None:
            structure = sparsity.structure if sparsity is not None else None
            (folder / "recipe.yaml").write_text(render_recipe(recipe, used, structure))
        if tokenizer_dir is not None:
            for name in TOKENIZER_FILES:
                if (Path(tokenizer_dir) / name).is_file():
                    shutil.copyfile(Path(tokenizer_dir) / name, folder / name)

    _write_atomically(out_dir, write)
    return out_dir


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of the model's floating-point parameters, which scales are stored in."""
    for parameter in model.parameters():
        if parameter.is_floating_point():
            return parameter.dtype
    raise CheckpointError("the model has no floating-point parameters.", hint="pass the model.")


def _assign_schemes(
    model: torch.nn.Module,
    quantized: Mapping[str, QuantizedWeight],
    schemes: Sequence[QuantizationScheme],
    dtype: torch.dtype,
) -> dict[str, QuantizationScheme]:
    """The scheme of each quantized module, checking that the checkpoint will reproduce it."""
    assignment = {}
    for name, weight in quantized.items():
        try:
            module = model.get_submodule(name)
        except AttributeError as err:
            raise CheckpointError(
                "no such module in the model.", hint="check the module path.", location=name
            ) from err
        targeting = [scheme for scheme in schemes if matches(name, module, scheme.targets)]
        if len(targeting) != 1:
            raise CheckpointError(
                f"{len(targeting)} schemes target this module; exactly one must, because "
                "loaders pick a module's scheme by `targets`.",
                hint="give each scheme targets that match disjoint modules.",
                location=name,
            )
        scheme = targeting[0]
        if weight.args != scheme.weights:
            raise CheckpointError(
                f"quantized with {weight.args}, but its scheme {scheme.name} says "
                f"{scheme.weights}.",
                hint="pass the scheme whose weight arguments produced this module.",
                location=name,
            )
        if weight.g_idx is not None:
            raise CheckpointError(
                "actorder='group' needs a g_idx, which compressed-tensors >= 0.20 and vLLM "
                "no longer load.",
                hint="quantize with actorder='static' (or None).",
                location=name,
            )
        if tuple(weight.int_weight.shape) != tuple(module.weight.shape):
            raise CheckpointError(
                f"quantized weight of shape {tuple(weight.int_weight.shape)} does not fit the "
                f"module's weight {tuple(module.weight.shape)}.",
                hint="pass the QuantizedWeight computed from this module's weight.",
                location=name,
            )
        if weight.scale.dtype != dtype:
            raise CheckpointError(
                f"scales are {weight.scale.dtype} but the model is {dtype}; loaders cast them, "
                "so the stored integers would no longer dequantize to the quantized weight.",
                hint="quantize the weight in the dtype the model is saved in.",
                location=name,
            )
        assignment[name] = scheme
    return assignment


def _checkpoint_tensors(
    model: torch.nn.Module,
    quantized: Mapping[str, QuantizedWeight],
    assignment: Mapping[str, QuantizationScheme],
) -> dict[str, torch.Tensor]:
    """Every tensor to store, in `state_dict` order, quantized weights replaced by integers."""
    tensors: dict[str, torch.Tensor] = {}
    aliases = set()
    for name, tensor in model.state_dict().items():
        module_name, _, tensor_name = name.rpartition(".")
        if module_name in quantized and tensor_name == "weight":
            prefix = module_name
            for key, value in module_tensors(prefix, quantized[prefix], assignment[prefix]).items():
                tensors[key] = value.detach().cpu()
            continue
        if tensor.is_meta:
            raise CheckpointError(
                "this tensor is on the meta device (offloaded), so it has no values to write.",
                hint="load the model's weights (onload them) before writing the checkpoint.",
                location=name,
            )
        alias = (tensor.device, tensor.data_ptr(), tensor.shape, tensor.stride())
        if alias in aliases:
            continue  # a tied weight: transformers ties it again from the config when loading
        aliases.add(alias)
        tensors[name] = tensor.detach().cpu().contiguous()
    return tensors


def _global_sparsity(
    model: torch.nn.Module, quantized: Mapping[str, QuantizedWeight], modules: Sequence[str]
) -> float:
    """Fraction of zeros over the weights of `modules`, as they will be stored (quantized ones
    counted from their integers: what loads is what the integers dequantize to)."""
    zeros, total = 0, 0
    for name in modules:
        weight = (
            quantized[name].dequantized() if name in quantized else model.get_submodule(name).weight
        )
        zeros += int((weight == 0).sum().item())
        total += weight.numel()
    return round(zeros / total, 6) if total else 0.0


def _write_atomically(out_dir: Path, write: Callable[[Path], None]) -> None:
    """Run `write` into a fresh hidden folder beside `out_dir`, then rename it to `out_dir`.

    On any failure the partial folder is removed and `out_dir` is left as it was. A previous
    `out_dir` is moved aside first and deleted only after the new folder is in place.
    """
    staging = out_dir.parent / f".{out_dir.name}.{uuid.uuid4().hex[:8]}.partial"
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        write(staging)
        _make_readable(staging)
        retired = None
        if out_dir.exists():
            retired = out_dir.parent / f".{out_dir.name}.{uuid.uuid4().hex[:8]}.old"
            os.replace(out_dir, retired)
        try:
            os.replace(staging, out_dir)
        except OSError:
            if retired is not None:
                os.replace(retired, out_dir)
            raise
        if retired is not None:
            shutil.rmtree(retired)
    except BaseException as err:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(err, OSError):
            raise OutputError.writing(out_dir, err) from err
        raise


def _make_readable(folder: Path) -> None:
    """Files 0644 and folders 0755, as a server running as another user needs them (some
    writers create private 0600 files)."""
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
