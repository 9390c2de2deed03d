"""``LayerCompressor``: the callbacks that turn what a pipeline shows into compressed weights.

While a pipeline calibrates a subgraph, hooks on its targeted linear layers (``Linear``, GPT-2's
transposed ``Conv1D``, one expert's projection: :mod:`llmc_trace.layers.linear`) fill their
Hessians (:mod:`~llmc_trace.calibrate.hessians`: one per distinct input, so q/k/v share one).
When the pipeline reports the subgraph calibrated, each layer is compressed
(:mod:`~llmc_trace.calibrate.solve`: GPTQ, SparseGPT, round-to-nearest or magnitude pruning) and
its weight replaced by the result, so error propagation sees compressed outputs; in a
distributed run the ranks merge their Hessians first and share the solves
(:mod:`~llmc_trace.calibrate.ranks`).

Mixture-of-experts layers stored fused (:mod:`llmc_trace.moe`) are compressed expert by
expert: each expert's gate, up and down projection is a target of its own with its own
Hessian. By default (``expert_tokens="all"``) every expert runs on every token for its Hessian
while the router still decides what reaches the output, so no expert is calibrated on a
handful of tokens; with ``"routed"`` an expert sees only the tokens routed to it, and one whose
Hessian holds fewer than ``min_expert_tokens`` tokens is rounded to nearest instead, recorded
in its :class:`~llmc_trace.calibrate.solve.LayerResult` (never silently). ``expert_group`` bounds
how many experts' Hessians are alive at once: the pipeline then calibrates a layer's experts in
several passes (:meth:`LayerCompressor.passes`).
"""

from __future__ import annotations

import logging

import torch

from llmc_trace.algorithms.quantize import QuantizedWeight
from llmc_trace.algorithms.scheme import QuantizationScheme
from llmc_trace.algorithms.sparsegpt import Sparsity
from llmc_trace.core.device_peak import DevicePeaks
from llmc_trace.core.solver import DEFAULTS, SolverSettings
from llmc_trace.core.names import ALL_TOKENS, BASELINE, DATA_METHODS
from llmc_trace.core.world import World
from llmc_trace.layers.linear import as_linear, is_linear
from llmc_trace.moe import expert_passes
from llmc_trace.calibrate.hessians import HessianCollector, SharedHessian, Targets
from llmc_trace.calibrate.ranks import assign_solves, merge_hessians, share_result
from llmc_trace.calibrate.solve import LayerResult, LayerSolver
from llmc_trace.pipelines.callbacks import NamedModules

logger = logging.getLogger(__name__)


class LayerCompressor:
    """Pipeline callbacks compressing every targeted layer of a subgraph (see the module
    docstring).

    The method's settings (``scheme`` ``None`` for pruning without quantization, ``sparsity``
    ``None`` for quantization without pruning, ``storage_dtype``, ``keep_zeros``,
    ``device_peaks``, ...) are :class:`~llmc_trace.calibrate.solve.LayerSolver`'s. ``skip``
    names layers left dense (the routers, a multimodal model's towers); ``world`` the ranks of a distributed run (default:
    one process). After the run, ``results`` holds one
    :class:`~llmc_trace.calibrate.solve.LayerResult` per compressed layer in order, and
    ``quantized`` the integers of each quantized one, for the checkpoint.
    """

    def __init__(
        self,
        method: str,
        scheme: QuantizationScheme | None,
        sparsity: Sparsity | None = None,
        settings: SolverSettings = DEFAULTS,
        storage_dtype: torch.dtype | None = None,
        keep_zeros: frozenset[str] = frozenset(),
        skip: frozenset[str] = frozenset(),
        expert_tokens: str = ALL_TOKENS,
        min_expert_tokens: int = 8,
        expert_group: int | None = None,
        world: World | None = None,
        device_peaks: DevicePeaks | None = None,
    ) -> None:
        self.solver = LayerSolver(
            method,
            scheme,
            sparsity,
            settings,
            storage_dtype,
            keep_zeros,
            min_expert_tokens,
            device_peaks,
        )
        self.skip = skip
        self.expert_tokens = expert_tokens
        #: experts calibrated in one pass (``None``: all of a layer's); a plan may set it
        self.expert_group = expert_group
        self.world = world or World()
        self.results: list[LayerResult] = []
        self._hessians = HessianCollector()

    @property
    def method(self) -> str:
        return self.solver.method

    @property
    def scheme(self) -> QuantizationScheme | None:
        return self.solver.scheme

    @property
    def quantized(self) -> dict[str, QuantizedWeight]:
        return self.solver.quantized

    def is_target(self, name: str, module: torch.nn.Module) -> bool:
        if not is_linear(module) or name in self.skip:
            return False
        if self.scheme is not None:
            return self.scheme.is_target(name, module)
        return not name.endswith("lm_head")

    def targets(self, modules: NamedModules) -> Targets:
        return [
            (name, layer)
            for name, module in modules
            if (layer := as_linear(module)) is not None and self.is_target(name, module)
        ]

    def wants(self, modules: NamedModules) -> bool:
        return bool(self.targets(modules))

    def passes(self, modules: NamedModules) -> list[NamedModules]:
        """The calibration passes ``modules`` need: one, unless ``expert_group`` bounds the
        experts calibrated at once (:func:`~llmc_trace.moe.passes.expert_passes`; the layer
        runs once per pass)."""
        if self.expert_group is None or self.method not in DATA_METHODS:
            return [modules]
        targets = [(name, layer.module) for name, layer in self.targets(modules)]
        return expert_passes(targets, self.expert_group) or [modules]

    def on_subgraph_start(self, index: int, modules: NamedModules) -> None:
        if self.method in DATA_METHODS:
            self._hessians.start(
                self.targets(modules),
                all_tokens=self.expert_tokens == ALL_TOKENS,
                subgraph=index,
            )

    def on_batch(self, batch: dict[str, torch.Tensor]) -> None:
        self._hessians.see_batch(batch)

    def on_calibrated(self, index: int, modules: NamedModules) -> None:
        targets = self.targets(modules)
        hessians = self._hessians.finish(targets)
        merge_hessians(self.world, hessians.values())
        owners = assign_solves(self.world, targets)
        done = self._solve_mine(targets, hessians, owners)
        for (name, layer), rank in zip(targets, owners, strict=True):
            result = share_result(
                self.world, name, layer, rank, done.get(name), self.quantized, self.scheme
            )
            self.results.append(result)
        few = [name for name, result in done.items() if result.fallback]
        if few:
            logger.warning(
                "%d expert projections (e.g. %s: %s) were compressed with %s instead of %s",
                len(few),
                few[0],
                done[few[0]].fallback,
                BASELINE[self.method],
                self.method,
            )

    def _solve_mine(
        self,
        targets: Targets,
        hessians: dict[str, SharedHessian | None],
        owners: list[int],
    ) -> dict[str, LayerResult]:
        """Solve the targets this rank owns, in order, emptying ``hessians`` as it goes.

        A shared Hessian is given up by this rank's last layer using it (the factorisation
        then reuses its storage) and freed as soon as that layer is done: nothing else holds
        it once it leaves ``hessians``."""
        rank = self.world.rank
        mine = {name for (name, _), owner in zip(targets, owners, strict=True) if owner == rank}
        last_user = {
            id(hessians[n]): n for n, _ in targets if n in mine and hessians[n] is not None
        }
        leaders: dict[int, str] = {}
        done: dict[str, LayerResult] = {}
        for name, layer in targets:
            hessian = hessians.pop(name)
            leader = leaders.setdefault(id(hessian), name) if hessian is not None else name
            if name not in mine:
                continue
            done[name] = self.solver.solve(
                name,
                layer,
                hessian,
                last_use=hessian is not None and last_user[id(hessian)] == name,
                shares_with=None if leader == name else leader,
            )
            del hessian
        return done

    def on_subgraph_end(self, index: int, modules: NamedModules) -> None:
        self._hessians.discard(name for name, _ in modules)
