"""The compression report as data: one row per compressed layer, the run's settings, and the
versioned JSON form ``compress`` writes as ``report.json``.

Schema ``llmc-trace/compression-report``, version 1 (keys sorted, two-space indent)::

    {"schema": "llmc-trace/compression-report", "version": 1,
     "model": "refmodel",                  # the model's folder or hub name, no absolute path
     "device": "cpu",                      # where the solves ran: cpu or cuda
     "device_peak_bytes": null,            # the run's CUDA peak up to writing; null on a CPU
     "settings": {"dataset": "calib.npy", "samples": 128, "seq_len": 512, "batch_size": 1,
                  "seed": 0, "dtype": "bfloat16", "tokens": 65536, "media_tokens": 0,
                  "stages": [{"method": "gptq", "scheme": "W4A16",
                              "weights": {"num_bits": 4, "group_size": 128, ...},
                              "sparsity": null, "pipeline": "sequential",
                              "solver": {"refine_passes": 0, "percdamp": ..., ...}}]},
     "subgraphs": [{"index": 1, "targets": ["model.layers.0"]}, ...],
     "layers": [{"name": "model.layers.0.self_attn.q_proj", "stage": 0, "method": "gptq",
                 "baseline": "rtn", "loss": 0.012, "baseline_loss": 0.034,
                 "relative_loss": 0.35, "num_tokens": 65536, "seconds": 0.02,
                 "device_peak_bytes": null, "shares_hessian_with": null, "subgraph": 1,
                 "fallback": null, "ignore": "--ignore model.layers.0.self_attn.q_proj
                 --ignore model.layers.0.self_attn.k_proj --ignore ..."}, ...],
     "summary": [{"stage": 0, "method": "gptq", "layers": 42, "loss": ..., ...}]}

A layer's ``loss`` is its method's objective, tr((W - Q) H_d (W - Q)^T) / 2 for the damped
Hessian H_d of its calibration inputs (the output error per token, plus the damping's ridge);
``baseline_loss`` is the same quantity for the data-free ``baseline`` (``rtn``, ``magnitude``
or ``magnitude+rtn``) on the same weights and H_d (:mod:`llmc_trace.algorithms.baseline`), and
``relative_loss`` their ratio: 1 means no gain over the baseline. Methods without data
(``rtn``, ``magnitude``) have no Hessian, so those three are ``null``, as are ``num_tokens``.
``device_peak_bytes`` is CUDA's ``max_memory_allocated`` during the layer's solve (reset before
it); ``null`` on a CPU, where no per-layer peak is measured (the process's peak resident set
cannot be reset for one layer without disturbing other measurements). ``ignore`` is the
``compress`` options that keep the layer in full precision, with the layers vLLM fuses with
it (a ``q_proj`` brings its ``k_proj`` and ``v_proj``), ``null`` where a stage only prunes.
``fallback`` says why a layer was compressed with the baseline instead of the stage's method
(an expert too few tokens reached; ``method`` then names the baseline, and it has no loss).
``subgraph`` is the index of the subgraph that runs the layer (``null`` when the model was not
traced). ``tokens`` is how many real tokens calibration saw (``seq_len`` only bounds a sample),
``media_tokens`` how many of them were media placeholders; both ``null`` for a data-free run
or a report written before they were kept. ``summary`` is derived from the rows, one entry per stage, and is not read back.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmc_trace.errors import BadInputError

SCHEMA = "llmc-trace/compression-report"
VERSION = 1
WORST = 5
"""Layers a summary names as having kept the most of their baseline's loss."""


@dataclass(frozen=True)
class StageSettings:
    """One stage as it ran: its method, its scheme (name and weight arguments), its sparsity
    (``"0.5"``, ``"2:4"``), the pipeline that ran it, and its solver settings: every option of
    :class:`~llmc_trace.core.solver.SolverSettings` by name, as a recipe writes it (a report
    written before they were kept together holds ``refine_passes`` and ``percdamp`` alone)."""

    method: str
    scheme: str | None
    weights: dict[str, Any] | None
    sparsity: str | None
    pipeline: str
    solver: dict[str, Any]


@dataclass(frozen=True)
class ReportSettings:
    """The run's calibration, the checkpoint's dtype, and its stages in order."""

    dataset: str
    samples: int
    seq_len: int
    batch_size: int
    seed: int
    dtype: str
    stages: tuple[StageSettings, ...]
    #: real tokens calibrated on, and how many of them were media placeholders (None: unknown)
    tokens: int | None = None
    media_tokens: int | None = None

    def calibrated_on(self) -> str:
        """What calibration saw, for a report's header: the tokens when known, else the
        request's bound."""
        if self.tokens is None:
            return f"{self.samples} samples of at most {self.seq_len} tokens"
        line = f"{self.samples} samples, {self.tokens} tokens"
        if self.media_tokens:
            line += f" ({self.media_tokens} of them media placeholders)"
        return line


@dataclass(frozen=True)
class SubgraphRow:
    """A subgraph of the traced model, by index, with the sequential targets it runs."""

    index: int
    targets: tuple[str, ...]


@dataclass(frozen=True)
class LayerRow:
    """One compressed layer (see the module docstring for each field's meaning)."""

    name: str
    stage: int
    method: str
    baseline: str | None
    loss: float | None
    baseline_loss: float | None
    num_tokens: int | None
    seconds: float
    device_peak_bytes: int | None
    shares_hessian_with: str | None
    subgraph: int | None
    fallback: str | None
    ignore: str | None

    @property
    def relative_loss(self) -> float | None:
        """loss / baseline_loss: the share of the baseline's error the method left."""
        if self.loss is None or not self.baseline_loss:
            return None
        return self.loss / self.baseline_loss


@dataclass(frozen=True)
class CompressionReport:
    """What ``compress`` did to each layer, and how it was asked to (see the module docstring)."""

    model: str
    device: str
    device_peak_bytes: int | None
    settings: ReportSettings
    subgraphs: tuple[SubgraphRow, ...]
    layers: tuple[LayerRow, ...]

    def worst(self, count: int | None = None, stage: int | None = None) -> list[LayerRow]:
        """Layers with a relative loss, highest first (ties in layer order), of one stage or
        all; the first ``count`` of them."""
        rows = [
            row
            for row in self.layers
            if row.relative_loss is not None and (stage is None or row.stage == stage)
        ]
        rows.sort(key=lambda row: -row.relative_loss)  # type: ignore[operator]
        return rows if count is None else rows[:count]

    def summary(self) -> list[dict[str, Any]]:
        """Per stage: its layers, total losses, their ratio, the median relative loss, the
        worst layers, seconds and the largest device peak."""
        summaries = []
        for index, stage in enumerate(self.settings.stages):
            rows = [row for row in self.layers if row.stage == index]
            compared = [row for row in rows if row.relative_loss is not None]
            loss = sum(row.loss for row in compared)  # type: ignore[misc]
            baseline = sum(row.baseline_loss for row in compared)  # type: ignore[misc]
            peaks = [row.device_peak_bytes for row in rows if row.device_peak_bytes is not None]
            summaries.append(
                {
                    "stage": index,
                    "method": stage.method,
                    "layers": len(rows),
                    "loss": loss if compared else None,
                    "baseline_loss": baseline if compared else None,
                    "relative_loss": loss / baseline if compared and baseline else None,
                    "median_relative_loss": (
                        statistics.median(row.relative_loss for row in compared)  # type: ignore[type-var]
                        if compared
                        else None
                    ),
                    "worst": [row.name for row in self.worst(WORST, index)],
                    "seconds": sum(row.seconds for row in rows),
                    "device_peak_bytes": max(peaks) if peaks else None,
                }
            )
        return summaries

    def to_json(self) -> dict[str, Any]:
        layers = [{**asdict(row), "relative_loss": row.relative_loss} for row in self.layers]
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "model": self.model,
            "device": self.device,
            "device_peak_bytes": self.device_peak_bytes,
            "settings": asdict(self.settings),
            "subgraphs": [asdict(subgraph) for subgraph in self.subgraphs],
            "layers": layers,
            "summary": self.summary(),
        }

    def dumps(self) -> str:
        """The report as ``report.json`` holds it: the same report gives the same bytes."""
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"


def read_report(path: str | Path) -> CompressionReport:
    """The report in ``path`` (a ``report.json``); anything else is bad input that says what
    is wrong with it and where."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise _not_a_report(path, f"it cannot be read ({err})") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise _not_a_report(
            path, f"it is not JSON ({err.msg} at line {err.lineno}, column {err.colno})"
        ) from None
    return parse_report(document, str(path))


def parse_report(document: object, where: str = "the report") -> CompressionReport:
    """A report from its JSON form (``CompressionReport.to_json``), every key checked."""
    reader = _Reader(where)
    top = reader.mapping(document, "the document")
    schema = reader.get(top, "schema", str)
    if schema != SCHEMA:
        raise _not_a_report(where, f"its schema is {schema!r}, not {SCHEMA!r}")
    version = reader.get(top, "version", int)
    if version != VERSION:
        raise BadInputError(
            f"{where} is a version {version} compression report; this llmc-trace reads "
            f"version {VERSION}.",
            hint="Redraw it with the llmc-trace that wrote it, or compress again with this one.",
            param="report",
        )
    settings = reader.mapping(reader.get(top, "settings", dict), "settings")
    stages = tuple(
        StageSettings(
            method=reader.get(stage, "method", str),
            scheme=reader.get(stage, "scheme", str, optional=True),
            weights=reader.get(stage, "weights", dict, optional=True),
            sparsity=reader.get(stage, "sparsity", str, optional=True),
            pipeline=reader.get(stage, "pipeline", str),
            solver=_solver(reader, stage),
        )
        for stage in reader.items(settings, "stages")
    )
    if not stages:
        raise _not_a_report(where, "it lists no stages; every run has at least one")
    subgraphs = tuple(
        SubgraphRow(reader.get(item, "index", int), tuple(reader.strings(item, "targets")))
        for item in reader.items(top, "subgraphs")
    )
    layers = tuple(_layer(reader, item, len(stages)) for item in reader.items(top, "layers"))
    if not layers:
        raise _not_a_report(where, "it lists no layers; every run compresses at least one")
    _check_references(where, subgraphs, layers)
    return CompressionReport(
        model=reader.get(top, "model", str),
        device=reader.get(top, "device", str),
        device_peak_bytes=reader.get(top, "device_peak_bytes", int, optional=True),
        settings=ReportSettings(
            dataset=reader.get(settings, "dataset", str),
            samples=reader.get(settings, "samples", int),
            seq_len=reader.get(settings, "seq_len", int),
            batch_size=reader.get(settings, "batch_size", int),
            seed=reader.get(settings, "seed", int),
            dtype=reader.get(settings, "dtype", str),
            stages=stages,
            tokens=reader.get(settings, "tokens", int, optional=True),
            media_tokens=reader.get(settings, "media_tokens", int, optional=True),
        ),
        subgraphs=subgraphs,
        layers=layers,
    )


def _solver(reader: _Reader, stage: Mapping[str, Any]) -> dict[str, Any]:
    """A stage's solver settings: its ``solver`` object, or the two a report written before
    they were kept together held beside the method."""
    if "solver" in stage:
        return dict(reader.get(stage, "solver", dict))
    return {
        "refine_passes": reader.get(stage, "refine_passes", int),
        "percdamp": reader.number(stage, "percdamp"),
    }


def _layer(reader: _Reader, item: Mapping[str, Any], stages: int) -> LayerRow:
    row = LayerRow(
        name=reader.get(item, "name", str),
        stage=reader.get(item, "stage", int),
        method=reader.get(item, "method", str),
        baseline=reader.get(item, "baseline", str, optional=True),
        loss=reader.number(item, "loss", optional=True),
        baseline_loss=reader.number(item, "baseline_loss", optional=True),
        num_tokens=reader.get(item, "num_tokens", int, optional=True),
        seconds=reader.number(item, "seconds"),
        device_peak_bytes=reader.get(item, "device_peak_bytes", int, optional=True),
        shares_hessian_with=reader.get(item, "shares_hessian_with", str, optional=True),
        subgraph=reader.get(item, "subgraph", int, optional=True),
        fallback=reader.get(item, "fallback", str, optional=True),
        ignore=reader.get(item, "ignore", str, optional=True),
    )
    if not 0 <= row.stage < stages:
        raise _not_a_report(reader.where, f"layer {row.name} names stage {row.stage}")
    return row


def _check_references(
    where: str, subgraphs: Sequence[SubgraphRow], layers: Sequence[LayerRow]
) -> None:
    """Every subgraph a layer names, and every layer it shares a Hessian with, must be in the
    report: a drawing of a layer in no subgraph the report holds would place it nowhere."""
    indices = {subgraph.index for subgraph in subgraphs}
    names = {layer.name for layer in layers}
    for layer in layers:
        if layer.subgraph is not None and layer.subgraph not in indices:
            held = f"subgraphs {min(indices)}-{max(indices)}" if indices else "no subgraphs"
            raise _not_a_report(
                where, f"layer {layer.name} names subgraph {layer.subgraph}, and it holds {held}"
            )
        if layer.shares_hessian_with is not None and layer.shares_hessian_with not in names:
            raise _not_a_report(
                where,
                f"layer {layer.name} shares a Hessian with {layer.shares_hessian_with}, "
                "a layer it does not list",
            )


class _Reader:
    """Typed access to a parsed JSON document, naming the key and the item of any mistake."""

    def __init__(self, where: str) -> None:
        self.where = where

    def mapping(self, value: object, what: str) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise _not_a_report(self.where, f"{what} is not an object")
        return value

    def get(
        self,
        mapping: Mapping[str, Any],
        key: str,
        kinds: type | tuple[type, ...],
        *,
        optional: bool = False,
    ) -> Any:
        where = _named(mapping, key)
        if key not in mapping:
            raise _not_a_report(self.where, f"{where} is missing")
        value = mapping[key]
        if value is None and optional:
            return None
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            wanted = " or ".join(kind.__name__ for kind in kinds)
            raise _not_a_report(self.where, f"{where} is {value!r}, not {wanted}")
        return value

    def number(self, mapping: Mapping[str, Any], key: str, *, optional: bool = False) -> Any:
        """A finite number of at least 0 (a loss, seconds, a damping), as a float: JSON as
        Python writes it may hold NaN and Infinity, which no loss or time can be."""
        value = self.get(mapping, key, (int, float), optional=optional)
        if value is None:
            return None
        if not (math.isfinite(value) and value >= 0):
            raise _not_a_report(
                self.where, f"{_named(mapping, key)} is {value!r}, not a finite number >= 0"
            )
        return float(value)

    def items(self, mapping: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
        return [self.mapping(item, f"an item of `{key}`") for item in self.get(mapping, key, list)]

    def strings(self, mapping: Mapping[str, Any], key: str) -> Sequence[str]:
        values = self.get(mapping, key, list)
        if not all(isinstance(value, str) for value in values):
            raise _not_a_report(self.where, f"`{key}` holds something other than strings")
        return values


def _named(mapping: Mapping[str, Any], key: str) -> str:
    """``key`` as a message names it: with the layer it belongs to, where it has a name."""
    return f"`{key}`" + (f" of {mapping['name']}" if isinstance(mapping.get("name"), str) else "")


def _not_a_report(where: object, detail: str) -> BadInputError:
    return BadInputError(
        f"{where} is not a readable compression report: {detail}.",
        hint="Pass the report.json that `llmc-trace compress` wrote into its --out folder.",
        param="report",
    )
