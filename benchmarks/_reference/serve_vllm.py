"""Serve checkpoints with vLLM's offline ``LLM`` and score rows by its ``prompt_logprobs``.

Runs inside ``benchmarks/.venv-vllm`` (see ``benchmarks/vllm_env.sh``), started by
``benchmarks/vllm_serving.py`` in a fresh process per checkpoint: vLLM pins its own torch and
transformers, and imports nothing from llmc-trace. Each row is one prompt; its perplexity is
exp(mean NLL) of tokens 1..T-1 given the tokens before them, the rows independent: the same
quantity ``llmc-trace evaluate`` computes.

When vLLM refuses a checkpoint the worker reports its error, and the caller reads the log for
the reason (this machine's vLLM may have no kernel for the checkpoint's scheme: its CPU build
lacks the weight-only int4/int8 ones on CPUs without AVX512). With ``--reference-kernel`` the
worker serves the same checkpoint once more with those layers' kernel replaced by a reference
one: vLLM still builds the model, creates every parameter with its scheme's shapes and dtypes
and loads every tensor through its own loaders (refusing a missing or misshapen one), and the
reference kernel dequantizes the loaded tensors with compressed-tensors' own unpacking
(``unpack_from_int32``: the format's reference, not llmc-trace's writer) and multiplies in
the activation dtype. So a checkpoint vLLM could not run here is still checked end to end,
and a reversed packing order shows as a wrong perplexity.

    python serve_vllm.py CHECKPOINT ROWS.npy --rows 16 [--reference-kernel]

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

        packed_name, scale_name, zero_name = self.names
        bits = self.config.weight_type.size_bits
        columns, rows = self.config.partition_weight_shape  # (in, out)
        shape = torch.Size([rows, columns])
        q = unpack_from_int32(getattr(layer, packed_name).data, bits, shape, packed_dim=1)
        scale = getattr(layer, scale_name).data.float()
        group = columns // scale.shape[1]
        q = q.float()
        if self.config.zero_points:
            zero_shape = torch.Size([rows, scale.shape[1]])
            zero = unpack_from_int32(getattr(layer, zero_name).data, bits, zero_shape, packed_dim=0)
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


def use_reference_kernel() -> None:
    """Make vLLM's weight-only compressed-tensors scheme use :class:`ReferenceWNA16Kernel`
    (in this process: the engine runs in it, see :func:`score`)."""
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import (
        compressed_tensors_wNa16 as wna16,
    )

    wna16.choose_mp_linear_kernel = lambda config, *args, **kwargs: ReferenceWNA16Kernel


def score(checkpoint: str, rows: list[list[int]], reference_kernel: bool) -> dict[str, object]:
    # engine and worker in this process: a kernel patched here is the one used, and starting
    # takes seconds instead of half a minute (no engine and worker processes to spawn)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if reference_kernel:
        use_reference_kernel()
    from vllm import LLM

    start = time.perf_counter()
    llm = LLM(
        model=checkpoint,
        tokenizer=checkpoint,
        dtype="auto",
        max_model_len=len(rows[0]) + 1,  # the prompt and the one token generate asks for
        enforce_eager=True,
        seed=0,
        # on the CPU backend this is the share of host memory vLLM reserves for itself; its
        # default (0.92) refuses to start beside anything else. The KV cache needs far less.
        gpu_memory_utilization=KV_SHARE,
        distributed_executor_backend="uni",
    )
    try:
        return _score(llm, rows, time.perf_counter() - start)
    finally:
        llm.llm_engine.engine_core.shutdown()  # else its processes outlive this one


def _score(llm, rows: list[list[int]], load_s: float) -> dict[str, object]:  # noqa: ANN001
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
    prompts = [TokensPrompt(prompt_token_ids=row) for row in rows]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    score_s = time.perf_counter() - start
    nll, count = 0.0, 0
    for row, output in zip(rows, outputs):
        for position, logprobs in enumerate(output.prompt_logprobs):
            if position == 0:
                continue  # the first token has no context
            nll -= logprobs[row[position]].logprob
            count += 1
    return {
        "perplexity": math.exp(nll / count),
        "load_s": load_s,
        "tokens_per_s": sum(len(row) for row in rows) / score_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("rows", help=".npy token ids, one prompt per row")
    parser.add_argument("--rows", type=int, default=16, dest="count")
    parser.add_argument(
        "--reference-kernel", action="store_true", help="weight-only layers on the reference kernel"
    )
    args = parser.parse_args()
    import numpy as np

    rows = np.load(args.rows)[: args.count].astype(int).tolist()
    try:
        result: dict[str, object] = {
            "ok": True,
            **score(args.checkpoint, rows, args.reference_kernel),
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
