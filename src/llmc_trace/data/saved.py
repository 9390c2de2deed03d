"""Read what `datasets` writes: `save_to_disk` folders and `.arrow` files, as tables.

`datasets.Dataset.save_to_disk` is how users of `datasets` keep prepared data, and a single
`.arrow` file is what its cache holds; both are read here through `datasets` itself (a
dependency), never re-implemented. Media columns (`Image`, `Audio`, `Video` features) are read
undecoded, as the `{"bytes": ..., "path": ...}` cells parquet stores, so that images decode in
`data.media` with the row named in any error, and audio needs no decoding library beyond the
standard library's `wave`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmc_trace.data.tables import TextTable
from llmc_trace.errors import DataError

#: Files `save_to_disk` writes beside the data: a folder holding one of them is a dataset.
SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


def is_saved_dataset(path: Path) -> bool:
    """Whether the folder `path` is one `save_to_disk` wrote (a dataset or a dataset dict)."""
    return path.is_dir() and any((path / name).is_file() for name in SAVED_MARKERS)


def read_saved_table(path: Path, kind: str, description: str, *, split: str) -> TextTable:
    """The `save_to_disk` folder (`kind` "disk") or `.arrow` file (`kind` "arrow") at `path`
    as a table; of a dataset dict, the split `split` (or its only split)."""
    import datasets

    try:
        if kind == "arrow":
            dataset = datasets.Dataset.from_file(str(path))
        else:
            dataset = datasets.load_from_disk(str(path))
    except IndexError as err:  # datasets' own failure on a saved dataset of no rows
        raise DataError(
            f"{description} holds no rows",
            hint="Save a dataset that has rows, or point at another one.",
            source=description,
        ) from err
    except (OSError, ValueError, FileNotFoundError) as err:
        raise DataError(
            f"{description} cannot be read by datasets ({_first_line(err)})",
            hint="Write it with datasets' save_to_disk (a folder) or point at one .arrow file "
            "it wrote.",
            source=description,
        ) from err
    if isinstance(dataset, datasets.DatasetDict):
        dataset = _split_of(dataset, split, description)
    return dataset_table(dataset, description)


def dataset_table(dataset: Any, description: str) -> TextTable:
    """A `datasets.Dataset` as a table, its media columns undecoded (see the module docstring)."""
    dataset = undecoded(dataset)

    def read_column(name: str) -> Any:
        return dataset[name]

    return TextTable(
        description=description,
        columns=tuple(dataset.column_names),
        num_rows=len(dataset),
        read_column=read_column,
    )


def undecoded(dataset: Any) -> Any:
    """`dataset` with each Image, Audio and Video column cast to its undecoded cells."""
    for name, feature in dataset.features.items():
        if getattr(feature, "decode", False) and type(feature).__name__ in (
            "Image",
            "Audio",
            "Video",
        ):
            dataset = dataset.cast_column(name, type(feature)(decode=False))
    return dataset


def _split_of(dataset: Any, split: str, description: str) -> Any:
    names = list(dataset)
    if split in dataset:
        return dataset[split]
    if len(names) == 1:
        return dataset[names[0]]
    raise DataError(
        f"{description} holds the splits {', '.join(names)} and none is {split!r}",
        hint="Save the split to calibrate with on its own (dataset['train'].save_to_disk(...)).",
        source=description,
    )


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
