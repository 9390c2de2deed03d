"""Write a compressed model as a compressed-tensors checkpoint folder that vLLM and transformers load.

The folder holds `config.json` (the model's config plus `quantization_config`, and the dtype
the tensors are stored in), the weights (`model.safetensors`, or shards of at most
`max_shard_size` bytes with `model.safetensors.index.json`), `generation_config.json` when the
model has one, `recipe.yaml` when a recipe is given, and from the source folder when one is
given: its tokenizer and processor files, its own `generation_config.json` (stop tokens and
sampling defaults, which a config-built model does not carry) and the `use_cache` its
`config.json` says (calibration turns caches off; generation wants them back). It is written into a hidden temporary folder beside the target and renamed
into place only when complete, so an interrupted write never leaves a half-written checkpoint
under the target's name (a run keeping resume points leaves that folder for the next run to
continue, never the target).

:class:`CheckpointWriter` takes the tensors one at a time, as a pipeline finishes them: every
output tensor is planned from the model and the schemes before the first is computed
(:func:`planned_tensors`), so each goes to its place in its shard at once
(:mod:`llmc_trace.checkpoint.shards`) and the writer holds none. :func:`save_compressed` writes
a model held in memory through the same writer.

Loading it back needs compressed-tensors installed and nothing else:
`AutoModelForCausalLM.from_pretrained(folder)` decompresses the weights on the first forward
pass (on CPU too; no `run_compressed=False` is needed), and
`from_pretrained(folder, quantization_config=CompressedTensorsConfig(dequantize=True))`
(`transformers.utils.quantization_config`) decompresses them while loading.

A GPT-2-style `Conv1D` layer (a Linear with its weight stored transposed) is compressed like a
Linear but stored dense, as the weight the compression left, and named in `ignore`: no loader
reads it quantized (see `llmc_trace.checkpoint.layout.stores_quantized`), so its compression
shows in the values, not in the checkpoint's size.

Three limits of today's loaders, not of the files: an asymmetric `pack-quantized` checkpoint
(W4A16_ASYM) loads through transformers only with `dequantize=True`, because compressed-tensors
0.20 prepares compressed modules without packing their zero points (its own checkpoints fail
the same way; llm-compressor issue #1618). And a W8A8 (`int-quantized`) model loaded compressed
also rounds its input activations per token, as vLLM does, so its logits differ from those of
the weight-only fake-quantized model by that activation rounding. And a mixture of experts
stored `int-quantized` (W8A8, W4A8) does not load in transformers 5.24 alone (see
:func:`assign_schemes`); vLLM reads it, and so does `load_pretrained`.

Tensor names are the paths of `model.state_dict()`, which are the checkpoint names for
decoder-only models such as Llama, Qwen or Mistral; models that transformers saves under other
names (its conversion mappings for some multimodal models) are not handled.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Collection, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from llmc_trace.checkpoint.layout import (
    format_of,
    ignored_modules,
    module_tensor_specs,
    module_tensors,
    quantization_config,
    stores_quantized,
)
from llmc_trace.errors import CheckpointError, LlmcTraceError, NonFiniteError, OutputError
from llmc_trace.algorithms.quantize import QuantizedWeight
from llmc_trace.algorithms.scheme import DEFAULT_SCHEME, QuantizationScheme, matches
from llmc_trace.algorithms.sparsegpt import Sparsity
from llmc_trace.checkpoint.shards import DEFAULT_MAX_SHARD_SIZE, ShardedSafetensors
from llmc_trace.moe import ExpertProjection, per_expert_tensors
from llmc_trace.core.finite import non_finite
from llmc_trace.core.sizes import TensorSpec, parameter_dtype

logger = logging.getLogger(__name__)

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
"""Files copied from `source_dir` when present: tokenizers, chat templates, processors."""


RESUME_FOLDER = "resume"
"""The staging folder's subfolder where a run keeps its resume point (never in the checkpoint)."""


@dataclass(frozen=True)
class WriterProgress:
    """An unfinished checkpoint: its staging folder, the tensors its shards hold, and the
    zeros counted in its pruned layers so far."""

    staging: Path
    written: list[str]
    zeros: int = 0
    counted: int = 0


@dataclass(frozen=True)
class SparsityInfo:
    """Which modules were pruned, and to what structure (0.5, or (2, 4) for 2:4)."""

    structure: Sparsity
    modules: tuple[str, ...]


def planned_tensors(
    model: torch.nn.Module,
    assignment: Mapping[str, QuantizationScheme],
    dtype: torch.dtype,
) -> dict[str, TensorSpec]:
    """Every tensor the checkpoint will hold, in the model's order, before any is computed.

    Parameters are stored in `dtype` (the checkpoint's; those transformers keeps in float32 in
    float32), buffers as they are; the weight of
    every module in `assignment` becomes its scheme's compressed tensors; a tied parameter is
    stored once, under its first name (transformers ties it again from the config). Works on
    a model whose parameters are on `meta`.
    """
    parameters = {id(p) for p in model.parameters()}
    experts = per_expert_tensors(model)
    float32 = _kept_in_float32(model, dtype)
    specs: dict[str, TensorSpec] = {}
    for name, tensor in unique_state(model).items():
        projections = experts.get(name, [])
        if projections and projections[0][1].stored_per_expert:
            for path, projection in projections:
                shape = tuple(projection.weight_of(tensor).shape)
                if path in assignment:
                    specs.update(module_tensor_specs(path, shape, assignment[path], dtype))
                else:
                    specs[f"{path}.weight"] = TensorSpec(dtype, shape)
            continue
        prefix, _, attr = name.rpartition(".")
        if attr == "weight" and prefix in assignment:
            specs.update(
                module_tensor_specs(prefix, tuple(tensor.shape), assignment[prefix], dtype)
            )
            continue
        stored = dtype if id(tensor) in parameters and tensor.is_floating_point() else tensor.dtype
        if stored != torch.float32 and float32 is not None and float32.search(name):
            stored = torch.float32
        specs[name] = TensorSpec(stored, tuple(tensor.shape))
    return specs


def _kept_in_float32(model: torch.nn.Module, dtype: torch.dtype) -> re.Pattern[str] | None:
    """The parameters transformers keeps in float32 whatever the model's dtype (its
    ``_keep_in_fp32_modules_strict``, e.g. DeepSeek's router ``gate.weight``; and, in a float16
    model, ``_keep_in_fp32_modules``), matched as transformers matches them: it loads them in
    float32 and saves them so, and rounding them to ``dtype`` would change every token's
    routing."""
    names: list[str] = []
    for module in model.modules():
        names += list(getattr(module, "_keep_in_fp32_modules_strict", None) or ())
        if dtype == torch.float16:
            names += list(getattr(module, "_keep_in_fp32_modules", None) or ())
    if not names:
        return None
    return re.compile("|".join(re.escape(name) for name in dict.fromkeys(names)))


def unique_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`model.state_dict(keep_vars=True)` with each tied tensor under its first name only."""
    seen: set[int] = set()
    state = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            state[name] = tensor
    return state


class CheckpointWriter:
    """One checkpoint folder, written tensor by tensor (see the module docstring).

    Every tensor is checked for NaN and inf as it is put (:func:`~llmc_trace.core.finite.
    non_finite`: one reduction, no copy); one that holds any ends the write, named, and the
    partial folder goes with it, so no checkpoint holding one is ever renamed into place.

    `assignment` names every module whose weight will be stored quantized, with its scheme;
    `quantized` is where their `QuantizedWeight`s appear (a compressor's dict): each is taken
    out of it when its module's weight is put (as is that of a compressed module stored
    dense, which needs only its weight). Modules in `pruned` have their zeros counted
    for the config's measured sparsity. Used as a context manager, an exception removes the
    partial folder (unless `keep_on_interrupt` says it holds a resume point, and the exception
    is an interruption or a failure a rerun need not meet); :meth:`commit` completes it and
    renames it into place. `resume` continues an interrupted run's folder, whose shards hold
    the tensors it names (:mod:`llmc_trace.oneshot.resume`).
    """

    def __init__(
        self,
        out_dir: str | Path,
        model: torch.nn.Module,
        assignment: Mapping[str, QuantizationScheme],
        quantized: MutableMapping[str, QuantizedWeight],
        *,
        dtype: torch.dtype,
        pruned: Collection[str] = (),
        max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
        overwrite: bool = False,
        resume: WriterProgress | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not overwrite:
            raise CheckpointError(
                "the output folder already exists.",
                hint="choose another folder, or pass overwrite=True to replace it.",
                location=str(self.out_dir),
            )
        self.config = getattr(model, "config", None)
        if self.config is None:
            raise CheckpointError(
                "the model has no `config`; a checkpoint needs one for config.json.",
                hint="pass a transformers PreTrainedModel.",
            )
        self.generation_config = getattr(model, "generation_config", None)
        self.assignment = dict(assignment)
        self.quantized = quantized
        self.dtype = dtype
        self.pruned = set(pruned)
        self.schemes = list(dict.fromkeys(self.assignment.values()))
        self.ignore = ignored_modules(model, self.schemes, self.assignment)
        self.specs = planned_tensors(model, self.assignment, dtype)
        self._experts = per_expert_tensors(model)
        #: keep the staging folder when the run is interrupted (it holds a resume point)
        self.keep_on_interrupt = False
        self.staging = (
            resume.staging
            if resume is not None
            else self.out_dir.parent / f".{self.out_dir.name}.{uuid.uuid4().hex[:8]}.partial"
        )
        self._zeros = resume.zeros if resume is not None else 0
        self._counted = resume.counted if resume is not None else 0
        try:
            self.out_dir.parent.mkdir(parents=True, exist_ok=True)
            self.staging.mkdir(exist_ok=resume is not None)
            self._shards = ShardedSafetensors(
                self.staging,
                self.specs,
                max_shard_size,
                written=resume.written if resume is not None else (),
            )
        except BaseException as err:  # not yet inside a ``with``: nothing else removes it
            if resume is None:
                shutil.rmtree(self.staging, ignore_errors=True)
            if isinstance(err, OSError):
                raise OutputError.writing(self.out_dir, err) from err
            raise

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if kind is not None:
            if self.keep_on_interrupt and not isinstance(error, (LlmcTraceError, OSError)):
                # interrupted (SIGINT, SIGTERM), or failed for a reason a rerun need not meet
                # (a rank lost, out of memory): the resume point stays. The run's own answer
                # (bad data, a non-finite value) would come again, and a full disk needs room
                self._shards.abandon()
                logger.warning(
                    "keeping %s: the run stopped (%s) after a resume point; the same "
                    "command continues from it (--overwrite starts afresh)",
                    self.staging,
                    type(error).__name__,
                )
                return
            self.abort()
            if isinstance(error, OSError):
                raise OutputError.writing(self.out_dir, error) from error

    def put(self, key: str, value: torch.Tensor) -> None:
        """Store the model tensor `key` (its compressed form when its module is quantized; a
        fused experts parameter as one tensor set per expert and projection, where the
        architecture's checkpoints store them so)."""
        projections = self._experts.get(key, [])
        if projections and projections[0][1].stored_per_expert:
            for path, projection in projections:
                self.put(f"{path}.weight", projection.weight_of(value))
            return
        for path, projection in projections:  # stored fused, dense: no integers needed
            self.quantized.pop(path, None)
            if path in self.pruned:
                self._count_zeros(projection.weight_of(value))
        prefix, _, attr = key.rpartition(".")
        if attr == "weight" and prefix in self.assignment:
            weight = self.quantized.pop(prefix, None)
            if weight is None:
                raise CheckpointError(
                    "this module's weight reached the checkpoint without being compressed.",
                    hint="the pipeline must compress every targeted module before it is written.",
                    location=prefix,
                )
            scheme = self.assignment[prefix]
            check_quantized(prefix, weight, scheme, tuple(value.shape), self.dtype)
            tensors = module_tensors(prefix, weight, scheme)
            if prefix in self.pruned:
                self._count_zeros(weight.dequantized())
        else:
            spec = self.specs.get(key)
            tensors = {key: value.to(spec.dtype) if spec is not None else value}
            if attr == "weight":
                self.quantized.pop(prefix, None)  # stored dense: its integers are not needed
                if prefix in self.pruned:
                    self._count_zeros(value)
        for name, tensor in tensors.items():
            problem = non_finite(tensor)
            if problem is not None:
                raise NonFiniteError(
                    f"{name} holds {problem} on its way into the checkpoint.",
                    hint="It was made from finite weights, by the cast to the checkpoint's "
                    "dtype (float16 holds at most 65504: try --dtype bfloat16) or by the "
                    "compression (please report it, with the command). Nothing was written; an "
                    "existing --out is as it was.",
                    location=name,
                )
            self._shards.put(name, tensor)

    def progress(self) -> WriterProgress:
        """What is on disk so far, flushed: where a resumed run continues."""
        self._shards.sync()
        return WriterProgress(self.staging, self._shards.written(), self._zeros, self._counted)

    def _count_zeros(self, weight: torch.Tensor) -> None:
        self._zeros += int((weight == 0).sum().item())
        self._counted += weight.numel()

    def commit(
        self,
        *,
        sparsity: Sparsity | None = None,
        recipe: str | None = None,
        source_dir: str | Path | None = None,
        files: Mapping[str, str] | None = None,
    ) -> Path:
        """Write the config and the small files, check every tensor arrived, and rename the
        folder into place (replacing an existing one only now, when overwriting). ``files``:
        more text files by name (the compression report), which appear with the checkpoint;
        ``source_dir``: the folder the model came from (see the module docstring).
        Inside the ``with`` block, so a failure here removes the partial folder too."""
        self._shards.close()
        config_dict = self.config.to_diff_dict()
        source = Path(source_dir) if source_dir is not None else None
        if source is not None and (source / "config.json").is_file():
            _restore_use_cache(config_dict, json.loads((source / "config.json").read_text()))
        config_dict["dtype"] = str(self.dtype).removeprefix("torch.")
        if self.schemes or sparsity is not None:
            measured = None
            if sparsity is not None:
                global_sparsity = round(self._zeros / self._counted, 6) if self._counted else 0.0
                measured = (sparsity, global_sparsity)
            config_dict["quantization_config"] = quantization_config(
                self.schemes, self.ignore, measured
            )
        folder = self.staging
        (folder / "config.json").write_text(
            json.dumps(config_dict, indent=2, sort_keys=True) + "\n"
        )
        if source is not None and (source / "generation_config.json").is_file():
            shutil.copyfile(source / "generation_config.json", folder / "generation_config.json")
        elif self.generation_config is not None:
            self.generation_config.to_json_file(folder / "generation_config.json", use_diff=True)
        if recipe is not None:
            (folder / "recipe.yaml").write_text(recipe)
        for name, text in (files or {}).items():
            (folder / name).write_text(text, encoding="utf-8")
        if source is not None:
            for name in TOKENIZER_FILES:
                if (source / name).is_file():
                    shutil.copyfile(source / name, folder / name)
        shutil.rmtree(folder / RESUME_FOLDER, ignore_errors=True)
        _make_readable(folder)
        _replace(self.out_dir, folder)
        return self.out_dir

    def abort(self) -> None:
        """Remove the partial folder; the target is left as it was."""
        self._shards.abandon()
        shutil.rmtree(self.staging, ignore_errors=True)


def save_compressed(
    model: torch.nn.Module,
    out_dir: str | Path,
    quantized: Mapping[str, QuantizedWeight],
    schemes: Sequence[QuantizationScheme] = (DEFAULT_SCHEME,),
    *,
    sparsity: SparsityInfo | None = None,
    recipe: str | None = None,
    source_dir: str | Path | None = None,
    overwrite: bool = False,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write `model`, held in memory, with the modules in `quantized` stored as integers.

    `quantized` maps module paths to their `QuantizedWeight`; each must be targeted by exactly
    one of `schemes` (by `targets` alone) and use that scheme's weight arguments, and its scales
    must be in the model's dtype, so that the stored integers dequantize exactly to the weight
    they were computed from; all of it is checked before anything is written. Every other
    tensor, including pruned but unquantized weights and the weights of quantized modules no
    loader reads quantized (a GPT-2 `Conv1D`: `assign_schemes`), is written as it is in
    `model`. With `sparsity`, the config states the structure and the measured sparsity of
    those modules; their weights stay dense (see
    `llmc_trace.checkpoint.layout.quantization_config` for why).

    `source_dir` is the folder the model was loaded from, whose tokenizer, processor and
    generation files the checkpoint keeps. An existing `out_dir` is an error unless
    `overwrite`, in which case it is replaced only once the new folder is complete.

    >>> import tempfile
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from llmc_trace.algorithms import W4A16, rtn
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
    dtype = _model_dtype(model)
    assignment = assign_schemes(model, quantized, schemes)
    for name, scheme in assignment.items():
        shape = tuple(model.get_submodule(name).weight.shape)
        check_quantized(name, quantized[name], scheme, shape, dtype)
    with CheckpointWriter(
        out_dir,
        model,
        assignment,
        dict(quantized),
        dtype=dtype,
        pruned=sparsity.modules if sparsity is not None else (),
        max_shard_size=max_shard_size,
        overwrite=overwrite,
    ) as writer:
        for key, value in unique_state(model).items():
            if value.is_meta:
                raise CheckpointError(
                    "this tensor is on the meta device (offloaded), so it has no values to write.",
                    hint="load the model's weights (onload them) before writing the checkpoint.",
                    location=key,
                )
            writer.put(key, value.detach())
        return writer.commit(
            sparsity=sparsity.structure if sparsity is not None else None,
            recipe=recipe,
            source_dir=source_dir,
        )


def _restore_use_cache(written: dict[str, Any], source: dict[str, Any]) -> None:
    """Give ``written`` (a config as a dict) the ``use_cache`` of ``source`` (the source
    folder's ``config.json``) at every level, sub-configs included: calibration builds the
    model with caches off, and a checkpoint saying so would make ``generate`` run without one.
    A level the source leaves at its default keeps the default."""
    if "use_cache" in written:
        if "use_cache" in source:
            written["use_cache"] = source["use_cache"]
        else:
            del written["use_cache"]
    for key, value in written.items():
        if isinstance(value, dict) and isinstance(source.get(key), dict):
            _restore_use_cache(value, source[key])
        elif isinstance(value, dict):
            value.pop("use_cache", None)


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    dtype = parameter_dtype(model)
    if dtype is None:
        raise CheckpointError("the model has no floating-point parameters.", hint="pass the model.")
    return dtype


def assign_schemes(
    model: torch.nn.Module,
    names: Collection[str],
    schemes: Sequence[QuantizationScheme],
) -> dict[str, QuantizationScheme]:
    """The scheme of each module in `names` that the checkpoint stores quantized: the one scheme
    whose `targets` match it. A module no loader reads quantized (`stores_quantized`: a GPT-2
    `Conv1D`) is left out, with a warning: its compressed weight is stored dense. Experts
    stored per expert in the `int-quantized` format (W8A8, W4A8) are warned of: that is the
    layout vLLM and compressed-tensors read, and llm-compressor writes, but transformers' loader
    (5.24, `CompressedTensorsDequantize`) decompresses per-expert tensors only in FP8 and
    packed formats, collects nothing from int8 `weight`s and fails joining the fused
    parameter (`llmc_trace.models.int8_experts` reads them for our own loads)."""
    assignment = {}
    dense, int_experts = [], []
    for name in names:
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
        if stores_quantized(module):
            assignment[name] = targeting[0]
            if isinstance(module, ExpertProjection) and format_of(targeting[0]) == "int-quantized":
                int_experts.append(name)
        else:
            dense.append(f"{name} ({type(module).__name__})")
    if dense:
        logger.warning(
            "%d compressed layers (e.g. %s) are stored dense, as the weights the compression "
            "left: compressed-tensors quantizes only torch.nn.Linear modules, so transformers "
            "could not load them packed. The checkpoint is not smaller for them.",
            len(dense),
            dense[0],
        )
    if int_experts:
        logger.warning(
            "%d expert projections (e.g. %s) are stored int-quantized (int8 per expert): vLLM "
            "and llmc-trace evaluate load them, but transformers (5.24) alone cannot read this "
            "checkpoint, because it joins per-expert compressed-tensors weights into fused "
            "experts only from the FP8 and packed formats. A weight-only scheme (W8A16, "
            "W4A16) loads in all three.",
            len(int_experts),
            int_experts[0],
        )
    return assignment


def check_quantized(
    name: str,
    weight: QuantizedWeight,
    scheme: QuantizationScheme,
    shape: tuple[int, ...],
    dtype: torch.dtype,
) -> None:
    """`weight` must be what `scheme` stores for a weight of `shape` in a `dtype` checkpoint."""
    if weight.args != scheme.weights:
        raise CheckpointError(
            f"quantized with {weight.args}, but its scheme {scheme.name} says {scheme.weights}.",
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
    if tuple(weight.int_weight.shape) != shape:
        raise CheckpointError(
            f"quantized weight of shape {tuple(weight.int_weight.shape)} does not fit the "
            f"module's weight {shape}.",
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


def _replace(out_dir: Path, staging: Path) -> None:
    """Rename the complete `staging` folder to `out_dir`; a previous `out_dir` is moved aside
    first and deleted only after the new folder is in place."""
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


def _make_readable(folder: Path) -> None:
    """Files 0644 and folders 0755, as a server running as another user needs them (some
    writers create private 0600 files)."""
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
