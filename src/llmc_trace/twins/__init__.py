"""Tiny twins saved as model folders with a processor made here (tokenizer, chat template,
image processor or feature extractor), so that tests and demos calibrate a vision-language or
audio model on its own data offline."""

from llmc_trace.twins.save import save_twin

__all__ = ["save_twin"]
