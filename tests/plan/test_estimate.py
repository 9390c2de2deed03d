"""The memory plan counts the compressor's state as the compressor keeps it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import llmc_trace.plan.estimate as plan_estimate

from llmc_trace import trace_subgraphs
from llmc_trace.graph.partition import partition_trace
from llmc_trace.pipelines.estimate import CompressorCost, RunSettings, compressing_and_keeping
from llmc_trace.plan.estimate import (
    compressor_costs,
    estimate_pipelines,
    shared_input_groups,
    solver_bytes,
)
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.trace import trace_graph
from tests.conftest import tiny_gpt2, tiny_llama, token_batch


def test_linears_reading_the_same_input_share_one_hessian() -> None:
    model = tiny_llama(layers=2, seed=0)
    partitioned = partition_trace(trace_graph(model, token_batch(2, 12, seed=0)))
    layer = model.model.layers[0]
    groups = shared_input_groups(layer, partitioned.trace.target_nodes[0])
    names = {id(m): n for n, m in layer.named_modules()}
    assert sorted(sorted(names[id(m)] for m in g) for g in groups) == [
        ["mlp.down_proj"],
        ["mlp.gate_proj", "mlp.up_proj"],
        ["self_attn.k_proj", "self_attn.q_proj", "self_attn.v_proj"],
        ["self_attn.o_proj"],
    ]
    hidden, inner = model.config.hidden_size, model.config.intermediate_size
    costs = compressor_costs(model, partitioned, RunSettings(4, 12))
    assert [c.hessian_bytes for c in costs] == [4 * (3 * hidden**2 + inner**2)] * 2
    assert costs[0].kept_bytes == sum(
        m.weight.numel() for m in layer.modules() if isinstance(m, torch.nn.Linear)
    )
    # compressed in module order, each Hessian freed after its last Linear (v, o, up, down),
    # which factors in the Hessian's storage; the others factor a copy
    attention, mlp = layer.self_attn, layer.mlp
    h, d = 4 * hidden**2, 4 * inner**2
    assert costs[0].compress_bytes == max(
        3 * h + d + solver_bytes(attention.q_proj, gives_up_hessian=False),
        3 * h + d + solver_bytes(attention.k_proj, gives_up_hessian=False),
        3 * h + d + solver_bytes(attention.v_proj),
        2 * h + d + solver_bytes(attention.o_proj),
        h + d + solver_bytes(mlp.gate_proj, gives_up_hessian=False),
        h + d + solver_bytes(mlp.up_proj),
        d + solver_bytes(mlp.down_proj),
    )


def test_gpt2_conv1d_layers_are_counted_from_their_input_widths() -> None:
    """GPT-2's Conv1D stores its weight (in, out); its Hessian is in x in all the same."""
    model = tiny_gpt2()
    partitioned = partition_trace(trace_graph(model, token_batch(2, 12, seed=0)))
    costs = compressor_costs(model, partitioned, RunSettings(4, 12))
    # c_attn, attn.c_proj and c_fc read 64 features each (three distinct inputs), mlp.c_proj 256
    assert [c.hessian_bytes for c in costs] == [4 * (3 * 64**2 + 256**2)] * 2
    block = model.transformer.h[0]
    assert costs[0].kept_bytes == sum(
        p.numel() for n, p in block.named_parameters() if n.endswith("weight") and p.dim() == 2
    )
    # 256 inputs, 64 outputs: the Hessian's copy and the factor are 256 x 256
    assert solver_bytes(block.mlp.c_proj, gives_up_hessian=False) == 4 * max(
        2 * 256**2 + 2 * 64 * 256, 256**2 + 6 * 64 * 256
    )


def test_sequential_cache_estimate_is_one_set_of_hidden_states_plus_shared_values() -> None:
    model = tiny_llama(layers=4, seed=0)
    partitioned = partition_trace(trace_graph(model, token_batch(3, 29, seed=0)))
    free = compressor_costs(model, partitioned, RunSettings(4, 29, needs_data=False))
    assert all(c.hessian_bytes == 0 and c.compress_bytes == 0 for c in free)
    first = partitioned.subgraphs[0]
    invariant = {n for n in first.output_names if n != "model_embed_tokens"}
    settings = RunSettings(64, 29, batch_size=3, dtype_bytes=4, device_is_host=True)
    by_name = {e.pipeline: e for e in estimate_pipelines(model, partitioned, settings, invariant)}
    values = {n.name: n.meta.get("val") for n in partitioned.trace.graph.nodes}
    hidden_set = 22 * values["model_embed_tokens"].numel() * 4  # 22 batches of 3
    shared = sum(
        v.numel() * v.element_size()
        for name in invariant
        for v in ([values[name]] if isinstance(values[name], torch.Tensor) else values[name])
    )
    # the embeddings slab arrives while the token ids and mask are still cached; the layers'
    # outputs reuse its rows
    inputs = 2 * 22 * values["input_ids"].numel() * 8
    assert by_name["sequential"].cache_bytes == hidden_set + shared + inputs
    assert by_name["sequential"].device_bytes < by_name["basic"].device_bytes

    # on a GPU host a slab holds its pinned block, the next power of two, where that wastes at
    # most an eighth of it: 22 batches' hidden states (489,984 bytes) hold 512 KiB and each
    # ids' slab (15,312) 16 KiB; 14 batches' (311,808 and 9,744) would waste more, and are
    # kept pageable, holding their size
    def on_gpu(samples: int) -> int:
        gpu = dataclasses.replace(settings, samples=samples, device_is_host=False)
        estimates = estimate_pipelines(model, partitioned, gpu, invariant)
        return next(e.cache_bytes for e in estimates if e.pipeline == "sequential")

    assert (hidden_set, inputs // 2) == (489_984, 15_312)
    assert on_gpu(64) == 512 * 1024 + shared + 2 * 16 * 1024
    assert on_gpu(40) == (hidden_set + inputs) // 22 * 14 + shared


def test_last_subgraph_restricted_to_its_layer_sees_the_same_inputs() -> None:
    model = tiny_llama(layers=2, seed=0)
    batch = token_batch(2, 12, seed=1)
    subgraphs = trace_subgraphs(model, batch, ["LlamaDecoderLayer"])
    last = subgraphs[-1]
    cut = last.restricted_to({"model.layers.1"})
    assert "lm_head" in last.module_paths() and cut.module_paths() == ["model.layers.1"]
    values = dict(batch)
    for subgraph in subgraphs[:-1]:
        values.update(subgraph.forward(model, **values))
    seen: list[torch.Tensor] = []
    handle = model.model.layers[1].register_forward_hook(lambda m, a, out: seen.append(out))
    with torch.no_grad():
        last.forward(model, **values)
        cut_output = cut.forward(model, **values)
    handle.remove()
    assert len(seen) == 2
    torch.testing.assert_close(seen[1], seen[0], rtol=0, atol=0)
    assert set(cut_output) == {"model_layers_1"}


class _Widening(torch.nn.Module):
    """x (4, 8) -> up (4, 512) -> relu -> a view -> down (4, 8): the wide values are what the
    code between two targets holds at once."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 512), torch.nn.Linear(512, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = torch.relu(self.up(x))
        return self.down(wide.view(4, 512)) + x


def test_transient_bytes_holds_the_values_alive_at_once() -> None:
    from torch.fx.passes.shape_prop import ShapeProp

    from llmc_trace.pipelines.estimate import transient_bytes

    graph = torch.fx.symbolic_trace(_Widening())
    ShapeProp(graph).propagate(torch.randn(4, 8))
    for node in graph.graph.nodes:
        node.meta["val"] = torch.empty(node.meta["tensor_meta"].shape)
    # up's output and relu's live together (the view is free); down's output is freed by the
    # add, which is returned (outputs are counted by the pipelines as a subgraph's outputs)
    nbytes = lambda value: value.numel() * value.element_size()  # noqa: E731
    assert transient_bytes(graph.graph, nbytes) == 2 * 4 * 512 * 4


def test_the_plan_counts_a_vision_towers_activations(twins, drawn_rows) -> None:
    """Qwen2-VL's first subgraph runs the vision tower over every patch of the batch: its
    MLP's inner activations (patches x intermediate width, float32) are a lower bound of what
    the plan must count there, which the same subgraph traced on text alone does not hold."""
    from llmc_trace.data import load_multimodal_calibration
    from llmc_trace.pipelines.estimate import scaled_bytes, transient_bytes
    from tests.multimodal import load_twin

    folder = twins("Qwen/Qwen2-VL-2B-Instruct")
    batch = load_multimodal_calibration(
        drawn_rows, folder, samples=2, seq_len=512, batch_size=2, shuffle=False
    ).batches[0]
    model = load_twin(folder)
    # the fix attempt --fix settles for Qwen2-VL's images (compress applies it itself)
    fixed = TracingOptions.parse(model, ["Qwen2VLModel.get_rope_index"])
    config = model.config
    media = [config.image_token_id, config.video_token_id, config.vision_start_token_id]
    text_ids = batch["input_ids"].masked_fill(
        torch.isin(batch["input_ids"], torch.tensor(media)), 7
    )
    text_batch = {"input_ids": text_ids, "attention_mask": batch["attention_mask"]}
    seq = int(batch["input_ids"].shape[1])

    def first_subgraph(sample: dict[str, torch.Tensor]) -> int:
        subgraph = partition_trace(trace_graph(model, sample, fixed)).subgraphs[0]
        assert not subgraph.targets  # what runs before the first decoder layer
        return transient_bytes(
            subgraph.graph, lambda value: scaled_bytes(value, 2, seq, (2, seq), 4)
        )

    patches = batch["pixel_values"].shape[0]
    vision = config.vision_config
    lower = patches * vision.embed_dim * vision.mlp_ratio * 4
    assert first_subgraph(batch) >= lower > first_subgraph(text_batch)


def test_fused_attention_on_a_gpu_holds_no_score_matrix() -> None:
    """``sdpa`` on a GPU runs flash or memory-efficient kernels: the plan leaves out the
    (seq, seq) scores that ``eager`` (and any attention on the CPU) holds, and nothing else."""
    model = tiny_llama(layers=2, seed=0)
    partitioned = partition_trace(trace_graph(model, token_batch(2, 16, seed=0)))
    batch, seq, dtype_bytes = 2, 256, 2
    heads = model.config.num_attention_heads

    def sequential_device(attention: str, on_the_cpu: bool) -> int:
        settings = RunSettings(
            8, seq, batch, dtype_bytes=dtype_bytes, attention=attention, device_is_host=on_the_cpu
        )
        estimates = estimate_pipelines(model, partitioned, settings, traced=(2, 16))
        return next(e for e in estimates if e.pipeline == "sequential").device_bytes

    scores = batch * heads * seq * (seq * (4 + dtype_bytes) - 4)
    assert sequential_device("eager", False) - sequential_device("sdpa", False) == scores
    assert sequential_device("eager", True) == sequential_device("sdpa", True)


def test_the_sequential_estimate_leaves_out_the_head_that_never_runs() -> None:
    """The pipeline stops after the last decoder layer: a larger vocabulary adds only its
    embedding rows to the device estimate, never ``lm_head``'s weight nor the logits (which
    alone would be batch x seq x vocab x 2 bytes here, more than the whole estimate)."""
    batch, seq, dtype_bytes = 2, 256, 2

    def sequential(vocab: int) -> object:
        model = tiny_llama(layers=2, seed=0)
        model.resize_token_embeddings(vocab)
        model.config.tie_word_embeddings = False
        partitioned = partition_trace(trace_graph(model, token_batch(2, 16, seed=0)))
        settings = RunSettings(8, seq, batch, dtype_bytes=dtype_bytes, attention="sdpa")
        estimates = estimate_pipelines(model, partitioned, settings, traced=(2, 16))
        return next(e for e in estimates if e.pipeline == "sequential")

    small, large = sequential(128), sequential(20_000)
    hidden = 64
    assert 0 <= large.device_bytes - small.device_bytes <= (20_000 - 128) * hidden * dtype_bytes
    assert large.device_bytes < batch * seq * 20_000 * dtype_bytes  # the logits of one batch
    for estimate in (small, large):
        assert set(estimate.device_phases) == {"calibrate", "solve", "propagate"}
        assert estimate.device_bytes == max(estimate.device_phases.values())


def test_the_hooks_float32_copy_of_the_widest_input_is_counted_while_calibrating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each Hessian's hook folds its batch in as a float32 copy: the widest input of a Llama
    layer is down_proj's, the MLP's inner width; the calibrate phase grows by tokens x inner x
    4 bytes with it (the solve phase, which holds no activations, does not)."""
    model = tiny_llama(layers=2, seed=0)
    partitioned = partition_trace(trace_graph(model, token_batch(2, 16, seed=0)))
    settings = RunSettings(8, 64, 2)
    costs = compressor_costs(model, partitioned, settings)
    assert [c.widest_input for c in costs] == [model.config.intermediate_size] * 2
    free = compressor_costs(model, partitioned, RunSettings(8, 64, 2, needs_data=False))
    assert [c.widest_input for c in free] == [0, 0]

    def phases() -> dict[str, int]:
        estimates = estimate_pipelines(model, partitioned, settings, traced=(2, 16))
        return next(e for e in estimates if e.pipeline == "sequential").device_phases

    with_copy = phases()
    without = [dataclasses.replace(c, widest_input=0) for c in costs]
    monkeypatch.setattr(plan_estimate, "compressor_costs", lambda *args: without)
    without_copy = phases()
    copy = 2 * 64 * model.config.intermediate_size * 4  # batch x seq x inner, float32
    assert with_copy["calibrate"] - without_copy["calibrate"] == copy
    assert with_copy["solve"] == without_copy["solve"]
    assert with_copy["propagate"] == without_copy["propagate"]


def test_on_one_memory_the_kept_integers_grow_as_the_hessians_are_given_up() -> None:
    """Three targets solved in order, each Hessian 8, each solve 2 beyond its Hessian: while
    target i is solved, the Hessians from i on and the integers of those before it are held."""

    def costs(kept: int) -> list[CompressorCost]:
        return [CompressorCost(hessian_bytes=8, compress_bytes=10, kept_bytes=kept)] * 3

    # 24 - 8 + 10 = 26 at the first target; then 16 - 8 + 10 + 6 = 24, 8 - 8 + 10 + 12 = 22;
    # counting the Hessians' peak and every integer together said 26 + 18 = 44
    assert compressing_and_keeping(costs(6)) == 26
    # integers larger than the Hessians: the most at the end, all of them (3 x 20)
    assert compressing_and_keeping(costs(20)) == 60
    assert compressing_and_keeping([]) == 0
