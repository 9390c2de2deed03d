"""``CompressRequest``: every input of a compression run, checked once before any heavy work."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from llmc_trace.checkpoint.shards import DEFAULT_MAX_SHARD_SIZE
from llmc_trace.algorithms.scheme import QuantizationScheme
from llmc_trace.core.names import ALL_TOKENS, AUTO, DATA_METHODS, GPTQ
from llmc_trace.data import validate_source
from llmc_trace.errors import BadInputError
from llmc_trace.models.samples import check_seq_len
from llmc_trace.models.weights import check_weight_files
from llmc_trace.models.source import ModelSource, resolve_model
from llmc_trace.oneshot.recipe import read_recipe
from llmc_trace.oneshot.stage import Stage, check_order


#: The fields that describe one stage; ``stages`` replaces them all.
STAGE_FIELDS = (
    "scheme",
    "method",
    "sparsity",
    "pipeline",
    "propagate_error",
    "true_sequential",
    "refine_passes",
    "expert_tokens",
    "min_expert_tokens",
    "expert_group",
)


@dataclass(frozen=True)
class CompressRequest:
    """What to compress, how, and where to; constructing one checks all of it.

    ``model``: a folder with weights. ``method``: ``gptq`` (with ``scheme``), ``sparsegpt``
    (with ``sparsity``, and ``scheme`` to also quantize), ``rtn`` or ``magnitude`` (the
    baselines). ``pipeline="auto"`` takes the memory plan's choice. ``true_sequential``
    calibrates each subgraph's layers in dependency stages (q/k/v, then o, then gate/up, then
    down), each on inputs from the stages before it already compressed; the sequential
    pipeline only, about 1.5x the calibration time. ``refine_passes``: at most this many
    passes of coordinate descent after each GPTQ sweep (`llmc_trace.algorithms.refine`); 0, the
    default, runs GPTQ alone (why: `llmc_trace.algorithms.gptq.gptq`). ``expert_tokens``,
    ``min_expert_tokens``, ``expert_group``: how mixture-of-experts layers calibrate
    (:class:`~llmc_trace.oneshot.stage.Stage`). Those ten fields are one stage's; ``stages`` lists several instead (:class:`~llmc_trace.oneshot.stage.Stage`,
    e.g. SparseGPT 2:4 then GPTQ W4A16), and after construction always holds the stages that
    will run.

    ``out_dir=None`` compresses in memory only (for evaluation). ``attn_implementation``: the
    attention kernel calibration runs, ``sdpa`` by default (what transformers and vLLM serve
    with: the same function as ``eager`` without holding each head's full attention matrix, so
    calibration is faster and peaks lower); architectures without it fall back to ``eager``.
    ``dtype``: the checkpoint's dtype, ``None`` for the one the model's ``config.json`` declares
    (what it was saved in); ``max_shard_size``: bytes of tensors per output shard. ``ignore``,
    ``sequential_targets``, ``targets_per_subgraph``: how the model is traced, as for
    ``attempt`` (fixes the trace needs are searched and added either way).

    Construction raises :class:`~llmc_trace.errors.BadInputError` naming the parameter (names,
    combinations, the model's weights, the output folder, the dataset's shape) and resolves
    the derived fields: ``source``, ``out_path`` and ``data_kind``.
    """

    model: str | Path | ModelSource
    dataset: str | Path
    out_dir: str | Path | None = None
    scheme: str | QuantizationScheme | None = "W4A16"
    method: str = GPTQ
    sparsity: str | float | None = None
    samples: int = 128
    seq_len: int = 512
    batch_size: int = 1
    seed: int = 0
    pipeline: str = AUTO
    propagate_error: bool = True
    true_sequential: bool = False
    refine_passes: int = 0
    expert_tokens: str = ALL_TOKENS
    min_expert_tokens: int = 8
    expert_group: int | None = None
    stages: Sequence[Stage] | None = None
    attn_implementation: str = "sdpa"
    dtype: torch.dtype | None = None
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE
    overwrite: bool = False
    ignore: Sequence[str] = ()
    sequential_targets: Sequence[str] | None = None
    targets_per_subgraph: int = 1
    source: ModelSource = field(init=False, repr=False)
    out_path: Path | None = field(init=False, repr=False)
    #: what the dataset is: "npy" token ids, a text file, a hub dataset...
    data_kind: str = field(init=False, repr=False)

    @property
    def needs_data(self) -> bool:
        return any(stage.method in DATA_METHODS for stage in self.stages or ())

    def __post_init__(self) -> None:
        if self.stages is None:
            stages: tuple[Stage, ...] = (
                Stage.parse(
                    self.method,
                    self.scheme,
                    self.sparsity,
                    pipeline=self.pipeline,
                    propagate_error=self.propagate_error,
                    true_sequential=self.true_sequential,
                    refine_passes=self.refine_passes,
                    expert_tokens=self.expert_tokens,
                    min_expert_tokens=self.min_expert_tokens,
                    expert_group=self.expert_group,
                ),
            )
        else:
            defaults = {f.name: f.default for f in fields(self) if f.name in STAGE_FIELDS}
            given = [name for name, value in defaults.items() if getattr(self, name) != value]
            if given:
                raise BadInputError(
                    f"{', '.join(given)} describe one stage, and stages were given too.",
                    hint="Put them in the stages (or give no stages).",
                    param=given[0],
                )
            stages = tuple(self.stages)
        check_order(stages)
        object.__setattr__(self, "stages", stages)
        self._check_run()
        model = self.model
        source = model if isinstance(model, ModelSource) else resolve_model(str(model))
        if source.folder is None:
            raise BadInputError(
                f"{source.name} has no weights to compress: built-ins and hub ids are configs.",
                hint="Point --model at a checkpoint folder (config.json beside *.safetensors).",
                param="model",
            )
        check_weight_files(source.folder)  # headers only: pickles, truncation, lost shards
        check_seq_len(source.config(), self.seq_len)
        out_path = Path(self.out_dir) if self.out_dir is not None else None
        if out_path is not None and out_path.exists() and not self.overwrite:
            raise BadInputError(
                f"the output folder {out_path} already exists.",
                hint="Choose another --out, or pass --overwrite.",
                param="out",
            )
        data = validate_source(self.dataset, samples=self.samples, seq_len=self.seq_len)
        for name, value in (("source", source), ("out_path", out_path), ("data_kind", data.kind)):
            object.__setattr__(self, name, value)

    @classmethod
    def from_recipe(
        cls,
        recipe: str | Path,
        model: str | Path | ModelSource,
        out_dir: str | Path | None = None,
        **overrides: object,
    ) -> CompressRequest:
        """The request a recipe file describes (:mod:`llmc_trace.oneshot.recipe`), with
        ``overrides`` (any field) taking the place of its values; the seven stage fields
        (``method``, ``scheme``, ...) change the stage of a one-stage recipe.

        >>> CompressRequest.from_recipe("out/recipe.yaml", "tiny-llama/", "again/")  # doctest: +SKIP
        """
        arguments = read_recipe(recipe)
        changes = {name: overrides.pop(name) for name in list(overrides) if name in STAGE_FIELDS}
        if changes:
            stages = arguments["stages"]
            if len(stages) != 1:
                raise BadInputError(
                    f"{', '.join(changes)} change one stage, and the recipe has {len(stages)}.",
                    hint="Edit the recipe's stages instead.",
                    param=next(iter(changes)),
                )
            current = {f.name: getattr(stages[0], f.name) for f in fields(Stage)}
            arguments["stages"] = (Stage.parse(**{**current, **changes}),)  # type: ignore[arg-type]
        arguments.update(overrides)
        if arguments.get("dataset") is None:
            raise BadInputError(
                f"no calibration data: the recipe {recipe} names no dataset.",
                hint="Pass --dataset, or add `dataset:` under the recipe's `calibration`.",
                param="dataset",
            )
        return cls(model, out_dir=out_dir, **arguments)

    def _check_run(self) -> None:
        """What holds for every stage, checked before anything is loaded."""
        if self.max_shard_size < 1:
            raise BadInputError(
                f"the shard size must be positive (got {self.max_shard_size} bytes).",
                hint="Pass e.g. --max-shard-size 5GB.",
                param="max_shard_size",
            )
        if self.targets_per_subgraph < 1:
            raise BadInputError(
                f"targets_per_subgraph must be at least 1 (got {self.targets_per_subgraph}).",
                hint="Use 1 for one decoder layer per subgraph.",
                param="targets_per_subgraph",
            )
