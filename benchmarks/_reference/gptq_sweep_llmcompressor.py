"""Run llm-compressor's GPTQ column sweep (``quantize_weight``) on given weights and Hessians.

Runs inside ``benchmarks/.venv-llmc``, started by ``benchmarks/gptq_agreement.py``. It imports
nothing from llmc-trace. The input file (``torch.save``) is a list of layers, each a dict with
``W`` (out, in), ``H`` (in, in), the group scales and zero points ``scale`` and ``zero_point``
(out, groups), ``bits`` and ``group_size``; the output file is the same list with ``Q``, the
weight as GPTQ left it (quantized and dequantized, as llm-compressor leaves it in the model),
and ``seconds`` added; it prints one line ``RESULT {json}`` with ``environment`` (this
process's versions and threads). The quantization arguments are those of llm-compressor's
preset W4A16 at ``bits``: integers, symmetric, groups, static activation order; dampening and
block size are ``GPTQModifier``'s defaults.

    python gptq_sweep_llmcompressor.py LAYERS_IN.pt LAYERS_OUT.pt --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_environment.py
from _environment import describe  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers_in")
    parser.add_argument("layers_out")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()

    import torch
    from compressed_tensors.quantization import QuantizationArgs
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.gptq.gptq_quantize import quantize_weight

    if args.threads:
        torch.set_num_threads(args.threads)
    defaults = GPTQModifier(targets="Linear", scheme="W4A16")
    layers = torch.load(args.layers_in)
    for layer in layers:
        quant_args = QuantizationArgs(
            num_bits=layer["bits"],
            type="int",
            symmetric=True,
            strategy="group",
            group_size=layer["group_size"],
            actorder="static",
        )
        start = time.perf_counter()
        quantized, _, used_rtn_fallback = quantize_weight(
            layer["W"][None].clone(),
            layer["H"][None].clone(),  # the sweep overwrites its Hessian
            layer["scale"][None],
            layer["zero_point"][None],
            None,
            quant_args,
            blocksize=defaults.block_size,
            percdamp=defaults.dampening_frac,
        )
        layer["seconds"] = time.perf_counter() - start
        layer["Q"] = quantized[0]
        layer["rtn_fallback"] = bool(used_rtn_fallback[0])
        del layer["H"]  # the caller has it
    torch.save(layers, args.layers_out)
    environment = describe(["llmcompressor", "compressed-tensors"])
    print("RESULT " + json.dumps({"environment": environment}), flush=True)


if __name__ == "__main__":
    main()
