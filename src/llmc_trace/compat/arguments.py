"""llm-compressor's ``DatasetArguments``, the fields that concern pipelines, read from either form.

llm-compressor hands its pipelines the whole ``DatasetArguments`` dataclass; code written
against it passes that object, and code that never imported llm-compressor passes a mapping.
Both are read into one :class:`PipelineArguments`. Fields of ``DatasetArguments`` that
describe the dataset (``dataset``, ``max_seq_length``, ...) are none of a pipeline's business
and pass silently; a name that ``DatasetArguments`` does not have is most likely a typo, and
all of them are named in one warning rather than dropped unseen.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmc_trace.errors import BadInputError
from llmc_trace.tracing.options import DEFAULT_TRACING_IGNORE

logger = logging.getLogger(__name__)

#: The other fields of llm-compressor 0.14's ``DatasetArguments``: how the dataloader is built
#: and options of other stages. Known, so never warned about; a pipeline does not read them.
DATASET_FIELDS = frozenset(
    {
        "dvc_data_repository",
        "dataset_path",
        "text_column",
        "remove_columns",
        "preprocessing_func",
        "batch_size",
        "data_collator",
        "dataset",
        "dataset_config_name",
        "max_seq_length",
        "concatenate_data",
        "raw_kwargs",
        "splits",
        "num_calibration_samples",
        "shuffle_calibration_samples",
        "streaming",
        "overwrite_cache",
        "preprocessing_num_workers",
        "pad_to_max_length",
        "min_tokens_per_module",
        "moe_calibrate_all_experts",
        "pipeline",
        "quantization_aware_calibration",
        "use_loss_mask",
        "dataloader_num_workers",
    }
)


@dataclass(frozen=True)
class PipelineArguments:
    """What a compat pipeline reads of ``DatasetArguments``, with llm-compressor's defaults.

    ``sequential_targets``: class names or ``re:`` patterns (a single string is one target),
    ``None`` for the model's own (:func:`~llmc_trace.compat.get_sequential_targets`).
    ``tracing_ignore``: functions, methods and module classes the trace records as one call.
    ``sequential_offload_device``: where intermediates wait between subgraphs; llmc-trace's
    pipelines keep them on the CPU (a GPU host pins them once), so another device is warned
    about and the CPU used. ``sequential_prefetch`` is accepted and has nothing to do: there is
    no background thread, each batch is copied from pinned memory when its turn comes.
    """

    sequential_targets: list[str] | None = None
    tracing_ignore: list[str] = dataclasses.field(
        default_factory=lambda: list(DEFAULT_TRACING_IGNORE)
    )
    sequential_targets_per_subgraph: int = 1
    propagate_error: bool = True
    sequential_offload_device: str = "cpu"
    sequential_prefetch: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.sequential_targets, str):
            object.__setattr__(self, "sequential_targets", [self.sequential_targets])
        if self.sequential_targets_per_subgraph < 1:
            raise BadInputError(
                "sequential_targets_per_subgraph must be at least 1, got "
                f"{self.sequential_targets_per_subgraph}.",
                hint="Put 1 or more sequential targets in each subgraph.",
                param="sequential_targets_per_subgraph",
            )


PIPELINE_FIELDS = frozenset(field.name for field in dataclasses.fields(PipelineArguments))


def pipeline_arguments(dataset_args: Any) -> PipelineArguments:
    """Read ``dataset_args`` (a ``DatasetArguments``, any object with such attributes, a
    mapping, or ``None`` for the defaults) into :class:`PipelineArguments`.

    Names that are not fields of ``DatasetArguments`` are named in one warning; a value the
    pipelines cannot honour (an offload device other than the CPU) is warned about too.
    """
    if dataset_args is None:
        return PipelineArguments()
    values = _fields_of(dataset_args)
    unknown = sorted(name for name in values if name not in PIPELINE_FIELDS | DATASET_FIELDS)
    if unknown:
        logger.warning(
            "dataset_args fields %s are not fields of llm-compressor's DatasetArguments; "
            "ignored (the pipelines read %s)",
            ", ".join(unknown),
            ", ".join(sorted(PIPELINE_FIELDS)),
        )
    arguments = PipelineArguments(
        **{name: value for name, value in values.items() if name in PIPELINE_FIELDS}
    )
    if arguments.sequential_offload_device != "cpu":
        logger.warning(
            "sequential_offload_device=%r: llmc-trace's pipelines keep intermediates on the "
            "CPU (pinned on a GPU host); using the CPU",
            arguments.sequential_offload_device,
        )
    return arguments


def _fields_of(dataset_args: Any) -> dict[str, Any]:
    if isinstance(dataset_args, Mapping):
        return dict(dataset_args)
    if dataclasses.is_dataclass(dataset_args) and not isinstance(dataset_args, type):
        return {f.name: getattr(dataset_args, f.name) for f in dataclasses.fields(dataset_args)}
    if hasattr(dataset_args, "__dict__"):
        return {k: v for k, v in vars(dataset_args).items() if not k.startswith("_")}
    raise BadInputError(
        f"dataset_args must be a DatasetArguments, an object with its attributes or a "
        f"mapping; got {type(dataset_args).__name__}.",
        hint="Pass e.g. {'sequential_targets': ['LlamaDecoderLayer'], 'propagate_error': True}.",
        param="dataset_args",
    )
