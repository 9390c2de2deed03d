"""Decide whether a calibration source names a local file or a Hugging Face Hub dataset.

A source is one string, as a user types it on a command line, so the decision is a rule, not a
guess made later by whoever fails first:

* a `Path`, an existing path, or a string that starts like a path (`/`, `.`, `~`) is a local file;
* a string whose suffix is a data-file suffix (`.jsonl`, `.csv`, `.npy`, ...) is a local file,
  even when it does not exist, so that a typo reads "file not found" and not "Hub unreachable";
* any other string that looks like a Hub id (`name` or `owner/name`) is a Hub dataset.

A folder `datasets.save_to_disk` wrote is a local dataset (kind `disk`), and so is a `.arrow`
file (kind `arrow`); both are read through `datasets` (`data.saved`).

Hub ids may contain dots (`owner/corpus-v1.2`), which is why only listed suffixes mean "file".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from llmc_trace.data.saved import is_saved_dataset
from llmc_trace.errors import DataError

TEXT_SUFFIXES: tuple[str, ...] = (".jsonl", ".json", ".parquet", ".txt")
TOKEN_SUFFIXES: tuple[str, ...] = (".npy",)
ARROW_SUFFIXES: tuple[str, ...] = (".arrow",)
SUPPORTED_SUFFIXES: tuple[str, ...] = TEXT_SUFFIXES + TOKEN_SUFFIXES + ARROW_SUFFIXES

# Suffixes that mean "a file" although we cannot read them; naming them gives a precise error.
_OTHER_FILE_SUFFIXES = frozenset(
    {".csv", ".tsv", ".npz", ".pt", ".pth", ".pkl", ".pickle", ".bin", ".safetensors",
     ".gz", ".bz2", ".xz", ".zst", ".zip", ".tar", ".md", ".html", ".xml", ".yaml", ".yml",
     ".h5", ".hdf5", ".xlsx", ".ndjson"}
)  # fmt: skip
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_SUPPORTED_HINT = (
    "Name a .jsonl, .json, .parquet or .txt text file, a .npy token array, a folder or .arrow "
    "file datasets' save_to_disk wrote, or a Hub dataset id."
)


@dataclass(frozen=True)
class ResolvedSource:
    """Where a calibration source lives.

    `kind` is the file suffix without its dot (`"jsonl"`, `"npy"`, `"arrow"`, ...), `"disk"`
    for a `save_to_disk` folder, or `"hub"`. `path` is set
    for local files and `hub_id` for Hub datasets. `description` is the source as the user gave
    it, for messages and reports (no absolute path is added, so reports stay reproducible).
    """

    kind: str
    description: str
    path: Path | None = None
    hub_id: str | None = None

    @property
    def is_token_array(self) -> bool:
        """Whether the source holds token ids already, so that no tokenizer is needed."""
        return self.kind == "npy"


def resolve_source(source: str | Path) -> ResolvedSource:
    """Classify `source` as a readable local file or a Hub dataset id.

    Raises `DataError` for a local file that is missing, a folder, of an unsupported type, or
    unreadable, so that these are reported before any loading starts.
    """
    description = str(source)
    if not description.strip():
        raise DataError("the calibration source is empty", hint=_SUPPORTED_HINT, param="dataset")
    if not isinstance(source, Path) and not _is_local(description):
        return ResolvedSource(kind="hub", description=description, hub_id=description)
    path = Path(source).expanduser()
    suffix = path.suffix.lower()
    if is_saved_dataset(path):
        return ResolvedSource(kind="disk", description=description, path=path)
    if path.is_dir():
        raise DataError(
            f"calibration source {description} is a folder, and not one datasets' save_to_disk "
            "wrote (it has no dataset_info.json or dataset_dict.json)",
            hint="Name one file inside it (a .jsonl, .json, .parquet or .txt text file, a .npy "
            "token array), or the folder or .arrow file datasets' save_to_disk wrote.",
            source=description,
        )
    if not path.exists():
        raise DataError(
            f"data file {description} does not exist",
            hint="Check the path (relative paths start from the current folder); a Hub "
            "dataset id has no file suffix.",
            source=description,
        )
    if suffix not in SUPPORTED_SUFFIXES:
        found = f"'{suffix}'" if suffix else "no suffix"
        raise DataError(
            f"data file {description} has an unsupported type ({found})",
            hint="Convert it to one of the supported formats. " + _SUPPORTED_HINT,
            source=description,
        )
    _check_readable(path, description)
    return ResolvedSource(kind=suffix[1:], description=description, path=path)


def _check_readable(path: Path, description: str) -> None:
    """Raise `DataError` unless the file at `path` opens and gives its first byte.

    Checked here, once for every file type, so that a file this user may not read is one clear
    message whichever reader (numpy, pyarrow, the text readers) would have met it first."""
    try:
        with path.open("rb") as file:
            file.read(1)
    except OSError as err:
        raise DataError(
            f"data file {description} cannot be read ({err.strerror or err})",
            hint="Make it readable by this user (for a link, the file it points to), or copy "
            "the data into a regular file that is.",
            source=description,
        ) from err


def _is_local(text: str) -> bool:
    if text.startswith(("/", ".", "~")) or Path(text).exists():
        return True
    suffix = Path(text).suffix.lower()
    if suffix in SUPPORTED_SUFFIXES or suffix in _OTHER_FILE_SUFFIXES:
        return True
    return _HUB_ID.fullmatch(text) is None
