"""Instantiate a model from its config: on ``meta`` for tracing, as a tiny twin for numbers."""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
import transformers
from transformers import PretrainedConfig, PreTrainedModel
from transformers.initialization import no_init_weights

from llmc_trace.core.versions import dotted, release
from llmc_trace.errors import BadInputError, LlmcTraceError
from llmc_trace.models.draws import pooled_draws
from llmc_trace.models.int8_experts import int8_expert_weights, reading_int8_experts
from llmc_trace.models.shrink import shrink_config
from llmc_trace.models.source import ModelSource
from llmc_trace.models.weight_store import WeightStore, check_float_storage, stored_names
from llmc_trace.models.weights import check_finite, missing_tensors

#: Auto classes tried, in order, when ``architectures`` names no class transformers exports.
AUTO_CLASSES = (
    "AutoModelForCausalLM",
    "AutoModelForImageTextToText",
    "AutoModelForSeq2SeqLM",
    "AutoModelForSpeechSeq2Seq",
    "AutoModel",
)


def model_class(config: PretrainedConfig, name: str) -> type[PreTrainedModel]:
    """The class named by ``architectures[0]``, else the first auto class that maps the config."""
    for arch in config.architectures or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    for auto_name in AUTO_CLASSES:
        auto = getattr(transformers, auto_name)
        try:
            return auto._model_mapping[type(config)]
        except KeyError:
            continue
    raise BadInputError(
        f"transformers has no model class for {name} (architectures={config.architectures}).",
        hint="Upgrade transformers, or pass a folder whose config names a supported class.",
        param="model",
    )


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def prepare_config(config: PretrainedConfig) -> PretrainedConfig:
    """Calibration never generates: caches off in every (sub-)config."""
    config.use_cache = False
    for sub in [config, *[v for v in vars(config).values() if isinstance(v, PretrainedConfig)]]:
        sub.use_cache = False
    return config


def build_meta_model(
    source: ModelSource, attn_implementation: str = "eager", dtype: torch.dtype | None = None
) -> PreTrainedModel:
    """The full-size model with every parameter on ``meta``: no memory, no initialisation."""
    config = source.config()
    cls = model_class(config, source.name)
    with _config_values_checked(source, cls):
        return build_meta_model_of(cls, config, attn_implementation, dtype)


def build_meta_model_of(
    cls: type[PreTrainedModel],
    config: PretrainedConfig,
    attn_implementation: str = "eager",
    dtype: torch.dtype | None = None,
) -> PreTrainedModel:
    """``cls`` at ``config``'s full size on ``meta`` (``config`` is prepared in place).

    Initializers are switched off (transformers' ``no_init_weights``): on ``meta`` they write
    nothing, yet each still runs its Python (fan-in arithmetic, the random op's decomposition),
    two fifths of Switch-large-128's build with its 6,500 linear layers. That switch also skips
    the tying that ``init_weights`` does, so the weights are tied here: an untied ``lm_head``
    would count Qwen2-VL-2B's 0.4 GiB embedding twice in every size and plan.
    """
    config = prepare_config(config)
    with _quiet_transformers(), torch.device("meta"), no_init_weights():
        # the model's own experts implementation: on meta, fused kernels avoid data-dependent
        # routing loops that would need phantom execution
        model = cls._from_config(
            config, attn_implementation=attn_implementation, dtype=dtype or _config_dtype(config)
        )
    model.tie_weights()
    return model.eval()


@contextlib.contextmanager
def _config_values_checked(source: ModelSource, cls: type[PreTrainedModel]) -> Iterator[None]:
    """A config transformers accepted but cannot build a model from (no heads to divide the
    width by, a negative vocabulary, an activation it does not know) is bad input, said as
    such: the failure comes from the values in config.json, not from llmc-trace."""
    try:
        yield
    except (ArithmeticError, KeyError, IndexError, ValueError, TypeError, RuntimeError) as err:
        if isinstance(err, LlmcTraceError):
            raise
        said = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise BadInputError(
            f"transformers cannot build {cls.__name__} from the config of {source.name}: "
            f"{type(err).__name__}" + (f": {said}" if said else "") + ".",
            hint="Correct the values in config.json (or restore it from the checkpoint it "
            "came from).",
            param="model",
        ) from err


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Every parameter registered inside lands on ``meta``; buffers stay real.

    Buffers a module computes at init and never saves (rotary ``inv_freq``) exist only if
    the constructor really runs; parameters are what checkpoints hold and what must not be
    allocated. ``torch.empty`` allocations are never touched, so they cost no resident memory
    before they move to ``meta`` (and an initialiser then runs on ``meta``, for free).
    """
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def build_skeleton(
    source: ModelSource,
    store: WeightStore,
    attn_implementation: str = "eager",
    dtype: torch.dtype | None = None,
) -> PreTrainedModel:
    """The full-size model with parameters on ``meta`` and real buffers, to fill from disk.

    Unlike :func:`build_meta_model` the buffers computed at init (rotary tables) hold their
    values, so a pipeline that reads each part's parameters from the checkpoint when it runs
    (:class:`~llmc_trace.pipelines.residency.Streamed`) computes what the loaded model would.
    Persistent buffers the checkpoint stores are read from ``store`` (the source's files).
    """
    config = prepare_config(source.config())
    cls = model_class(config, source.name)
    with _config_values_checked(source, cls), _quiet_transformers(), _parameters_on_meta():
        model = cls._from_config(
            config,
            attn_implementation=attn_implementation,
            dtype=dtype or checkpoint_dtype(config, store),
        )
    stored_names(model, store)  # refuses missing and misshapen tensors before any work
    saved = [name for name, _ in model.named_buffers() if name in store]
    for name, value in store.read(saved).items():
        owner, _, attr = name.rpartition(".")
        model.get_submodule(owner)._buffers[attr] = value
    return model.eval()


def build_twin(
    source: ModelSource,
    seed: int = 0,
    attn_implementation: str = "eager",
    dtype: torch.dtype = torch.float32,
    min_layers: int = 2,
) -> PreTrainedModel:
    """The tiny twin: same architecture and code paths, small sizes, seeded random weights."""
    config = source.config()
    cls = model_class(config, source.name)
    return twin_of_class(cls, config, seed, attn_implementation, dtype, min_layers)


def twin_of_class(
    cls: type[PreTrainedModel],
    config: PretrainedConfig,
    seed: int = 0,
    attn_implementation: str = "eager",
    dtype: torch.dtype = torch.float32,
    min_layers: int = 2,
) -> PreTrainedModel:
    """``cls`` built from ``config`` shrunk to a tiny twin (``config`` itself is not changed):
    the twin of a model the caller built, whose class no config names."""
    config = prepare_config(shrink_config(copy.deepcopy(config), min_layers))
    with _quiet_transformers(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with pooled_draws(), _initialized_once():
            model = _instantiate(cls, config, attn_implementation=attn_implementation, dtype=dtype)
    return model.eval()


@contextlib.contextmanager
def _initialized_once() -> Iterator[None]:
    """Linear and embedding layers drawn once, by the model's own initialization, not twice.

    ``nn.Linear`` and ``nn.Embedding`` draw their weights when made, and transformers' init
    then draws them again: half of a twin's build time. Here they are made zero, the model's
    init draws them, and the few it leaves alone (still all zero) get torch's own draw after.
    """
    made: list[tuple[torch.nn.Module, object]] = []
    originals = {kind: kind.reset_parameters for kind in (torch.nn.Linear, torch.nn.Embedding)}

    def zeroed_by(original: object) -> object:
        def zeroed(module: torch.nn.Module) -> None:
            made.append((module, original))
            with torch.no_grad():
                for tensor in (module.weight, getattr(module, "bias", None)):
                    if tensor is not None and tensor.device.type != "meta":
                        tensor.zero_()

        return zeroed

    for kind, original in originals.items():
        kind.reset_parameters = zeroed_by(original)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for kind, original in originals.items():
            kind.reset_parameters = original  # type: ignore[method-assign]
    for module, original in made:
        weight = module.weight
        if weight.device.type != "meta" and not _drawn(weight):
            original(module)  # type: ignore[operator]


def _drawn(weight: torch.Tensor) -> bool:
    """Whether any entry of ``weight`` is non-zero. A drawn weight shows it in its first few
    entries, so the whole tensor (a large vocabulary's embedding) is read only when those are
    all zero."""
    flat = weight.detach().reshape(-1)
    return bool(flat[:256].any()) or bool(flat.any())


def load_pretrained(
    source: ModelSource,
    attn_implementation: str | None = "eager",
    dtype: torch.dtype | None = None,
) -> PreTrainedModel:
    """The real model with its weights, for folders that have them, on the CPU, in ``dtype``
    (default: the one its ``config.json`` declares).

    Weights that cannot be this config's model (a missing, truncated, pickled or misshapen
    tensor, float weights stored as integers, or one holding NaN or inf) raise
    :class:`~llmc_trace.errors.BadInputError` instead of loading half.

    ``attn_implementation=None`` takes transformers' own default kernel. A compressed-tensors
    checkpoint is decompressed by transformers itself, the path a user's code takes (see
    :func:`_decompress_at_load` for the one case that must be told to); experts stored as
    int8 (W8A8), which transformers cannot read alone, are decompressed by
    :func:`~llmc_trace.models.int8_experts.reading_int8_experts`.
    """
    folder = source.weights_folder("load")
    store = WeightStore(folder)  # headers only: pickles, truncation, lost shards
    config = source.config()
    holds_int8_experts = bool(int8_expert_weights(store))
    _check_loader(config, folder, holds_int8_experts)
    cls = model_class(config, source.name)
    kernel = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    int8_experts = reading_int8_experts() if holds_int8_experts else contextlib.nullcontext()
    try:
        with _quiet_transformers(), int8_experts:
            model, info = cls.from_pretrained(
                folder,
                dtype=dtype or checkpoint_dtype(config, store),
                use_safetensors=True,
                output_loading_info=True,
                **kernel,
                **_decompress_at_load(config),
            )
    except (RuntimeError, OSError, ValueError) as err:  # shapes that do not fit the config
        expected = {k: tuple(v.shape) for k, v in build_meta_model(source).state_dict().items()}
        # names the model does not have (a compressed checkpoint's packed weights) not compared
        wrong = [
            (name, stored.shape, expected[name])
            for name, stored in store.tensors.items()
            if name in expected and stored.shape != expected[name]
        ]
        reason = (
            "; ".join(
                f"{name} is {got} in the file, {want} by the config"
                for name, got, want in wrong[:3]
            )
            if wrong
            else str(err).strip().splitlines()[0]
        )
        hint = (
            "Every tensor must have the shape its config.json implies: check that the weights "
            "and config.json come from the same checkpoint."
        )
        if not wrong and "quantization_config" in source.config_dict:
            # packed tensors have no counterpart in the dense model to compare shapes with;
            # transformers' own list of them is what its quieted logger would have shown
            reason = "its stored tensors do not have the shapes its quantization_config implies"
            hint = (
                "The packed shapes follow from the config's num_bits, group size and "
                "strategy: restore the config.json the checkpoint was written with."
            )
        raise BadInputError(
            f"The weights in {folder} do not load as {cls.__name__}: {reason}.",
            hint=hint,
            param="model",
        ) from err
    missing = sorted(info["missing_keys"])
    if missing:
        raise missing_tensors(folder, missing)
    if "quantization_config" not in source.config_dict:
        # transformers cast integer-stored float weights as it loaded them, without a word
        for name, parameter in model.named_parameters():
            if parameter.is_floating_point() and name in store:
                check_float_storage(store, name, store.tensors[name])
    checked: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in checked:  # a tied tensor once, under its first name
            checked.add(id(tensor))
            check_finite(folder, name, tensor)
    prepare_config(model.config)
    return model.eval()


def _instantiate(
    cls: type[PreTrainedModel], config: PretrainedConfig, **kwargs: object
) -> PreTrainedModel:
    """``cls._from_config`` with eager MoE experts where the model lets us choose.

    Fused grouped-matmul experts demand aligned strides that tiny twins do not have, and
    eager experts are plain loops over ``nn.Linear``-like weights that hooks can observe.
    """
    try:
        return cls._from_config(config, experts_implementation="eager", **kwargs)
    except (ValueError, TypeError):
        return cls._from_config(config, **kwargs)


#: transformers' first release whose compressed-tensors loader reads a checkpoint that
#: quantizes no weights (sparsity alone): earlier ones read the absent scheme's config groups
#: and fail with an AttributeError on ``None``
QUANTIZES_NOTHING_LOADS = (5, 23)
#: the first release whose loader, with :func:`reading_int8_experts`, reads experts stored as
#: int8: before 5.21 it has no op to decompress them into, and 5.21-5.22 collect no int8 weight
INT8_EXPERTS_LOAD = (5, 23)


def _check_loader(config: PretrainedConfig, folder: Path, int8_experts: bool) -> None:
    """Refuse, before loading, a compressed-tensors checkpoint the installed transformers
    cannot load: one that quantizes nothing, or one whose experts are stored as int8
    (``int8_experts``)."""
    quantization = getattr(config, "quantization_config", None)
    if (
        not isinstance(quantization, dict)
        or quantization.get("quant_method") != "compressed-tensors"
    ):
        return
    if not quantization.get("config_groups"):
        _needs_release(QUANTIZES_NOTHING_LOADS, folder, "quantizes no weights (sparsity alone)")
    if int8_experts:
        _needs_release(INT8_EXPERTS_LOAD, folder, "stores its experts' weights as int8")


def _needs_release(needed: tuple[int, int], folder: Path, what: str) -> None:
    """Refuse a checkpoint that ``what`` says of, if transformers reads it only from ``needed``."""
    version = transformers.__version__
    if release(version) >= needed:
        return
    raise BadInputError(
        f"transformers {version} cannot load {folder}: it is a compressed-tensors checkpoint "
        f"that {what}, which transformers loads from {dotted(needed)} on.",
        hint=f"Upgrade transformers (pip install -U 'transformers>={dotted(needed)}').",
        param="model",
    )


def _decompress_at_load(config: PretrainedConfig) -> dict[str, object]:
    """Loading options for an asymmetric packed (``pack-quantized``) checkpoint: decompress
    while loading (``dequantize=True``), the one way today's transformers reads its packed zero
    points (see the limits in :mod:`llmc_trace.checkpoint.writer`); the weights are the same."""
    quantization = getattr(config, "quantization_config", None)
    if not isinstance(quantization, dict) or quantization.get("format") != "pack-quantized":
        return {}
    groups = quantization.get("config_groups", {}).values()
    if all((group.get("weights") or {}).get("symmetric", True) for group in groups):
        return {}
    from transformers import CompressedTensorsConfig

    return {"quantization_config": CompressedTensorsConfig(dequantize=True)}


def checkpoint_dtype(config: PretrainedConfig, store: WeightStore) -> torch.dtype:
    """The dtype ``config.json`` declares, else the one its floating-point tensors are saved in
    (transformers' ``dtype="auto"``)."""
    if getattr(config, "dtype", None) or getattr(config, "torch_dtype", None):
        return _config_dtype(config)
    stored = (t.dtype for t in store.tensors.values() if t.dtype.is_floating_point)
    return next(stored, torch.float32)


def _config_dtype(config: PretrainedConfig) -> torch.dtype:
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and hasattr(torch, value):
        candidate = getattr(torch, value)
        if isinstance(candidate, torch.dtype):
            return candidate
    return torch.bfloat16
