"""A checkpoint folder's own tokenizer, for text data: loaded once before any heavy work so
that a broken or missing one is refused in a sentence, never mid-run."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from llmc_trace.errors import BadInputError


def load_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in ``folder``, never remote code nor a download. A folder without
    one, or with files that do not parse (a truncated tokenizer.json, an empty
    tokenizer_config.json, one that cannot be read) raises
    :class:`~llmc_trace.errors.BadInputError` naming the folder and the reason."""
    try:
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
    except (OSError, ValueError, TypeError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BadInputError(
            f"{folder}'s tokenizer does not load ({reason}).",
            hint="Text data needs the checkpoint's own tokenizer files beside its weights "
            "(tokenizer.json, or tokenizer.model with tokenizer_config.json), loadable without "
            "remote code; or give the data as a .npy array of the model's token ids.",
            param="model",
        ) from err
