"""The layer compressor: the pipeline callbacks that turn what a calibration pipeline shows
into compressed weights.

Hooks fill each targeted layer's Hessian (:mod:`~llmc_trace.calibrate.hessians`); when a
subgraph is calibrated, the ranks of a distributed run merge them and share the solves
(:mod:`~llmc_trace.calibrate.ranks`), and each layer is compressed by its stage's method
(:mod:`~llmc_trace.calibrate.solve`: GPTQ, SparseGPT, round-to-nearest, magnitude pruning),
all driven by :class:`~llmc_trace.calibrate.compressor.LayerCompressor`. It knows layers,
tensors and ranks, not requests, files or stages: the driver (:mod:`llmc_trace.oneshot`)
builds one per stage.
"""
