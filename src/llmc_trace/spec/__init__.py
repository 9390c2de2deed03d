"""What a compression run is, as data: its stages, its settings sections, its recipe file.

``Stage`` (:mod:`~llmc_trace.spec.stage`), ``CalibrationSettings``, ``TracingSettings`` and
``CheckpointSettings`` (:mod:`~llmc_trace.spec.settings`) declare every option of ``compress``
(:mod:`llmc_trace.core.declare`), and a recipe (:mod:`~llmc_trace.spec.recipe`) is their
written form. The command line builds its flags from these declarations and the docs read
them; nothing here imports torch or touches a model, a file of weights or a dataset (the
driver, :mod:`llmc_trace.oneshot`, does, once a request is made).
"""
