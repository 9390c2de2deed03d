"""Open a Hugging Face Hub dataset as a `TextTable`, with failures turned into `DataError`.

`datasets` reports an unreachable Hub as a `ConnectionError` (after several retries), a missing
dataset as `DatasetNotFoundError` and a bad split as a bare `ValueError`; here each becomes a
`DataError` whose hint names a way forward, most often a local file or a `.npy` token array,
because calibration must also work on machines without network access.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from llmc_trace.core.hub import offline_if_unreachable
from llmc_trace.data.saved import dataset_table
from llmc_trace.data.tables import TextTable
from llmc_trace.errors import DataError

_OFFLINE_HINT = (
    "Use a local .jsonl, .json, .parquet or .txt file, a save_to_disk folder, or a .npy token "
    "array, instead; or run "
    "where huggingface.co is reachable (or the dataset is in the local `datasets` cache)."
)


@dataclass(frozen=True)
class HubMetadata:
    """What the Hub says about a dataset split without downloading its data.

    `columns` is empty and `num_rows` is None where the dataset card does not declare them.
    """

    columns: tuple[str, ...]
    num_rows: int | None


def read_hub_metadata(hub_id: str, *, split: str, subset: str | None) -> HubMetadata:
    """Fetch the column names and row count of `split` from the dataset's metadata only."""
    import datasets

    with _translated_errors(hub_id, split=split, subset=subset):
        builder = datasets.load_dataset_builder(hub_id, subset)
    info = builder.info
    columns = tuple(info.features) if info.features is not None else ()
    # A sliced split such as "train[:1000]" has no row count of its own in the metadata.
    split_info = (info.splits or {}).get(split)
    num_rows = split_info.num_examples if split_info is not None else None
    return HubMetadata(columns=columns, num_rows=num_rows or None)


def read_hub_table(hub_id: str, *, split: str, subset: str | None) -> TextTable:
    """Download (or read from the local cache) one split of a Hub dataset as a table (media
    columns undecoded, as `data.saved.dataset_table` reads them).

    `split` takes `datasets`' slicing syntax, e.g. `"train[:2000]"`, which keeps a large corpus
    from being downloaded and prepared in full when only a few hundred samples are needed.
    """
    import datasets

    with _translated_errors(hub_id, split=split, subset=subset):
        dataset = datasets.load_dataset(hub_id, subset, split=split)
    description = f"{hub_id} ({subset + ', ' if subset else ''}split {split})"
    return dataset_table(dataset, description)


@contextmanager
def _translated_errors(hub_id: str, *, split: str, subset: str | None) -> Iterator[None]:
    from datasets.exceptions import DatasetNotFoundError

    try:
        with offline_if_unreachable():
            yield
    except DatasetNotFoundError as err:
        raise DataError(
            f"Hub dataset {hub_id!r} was not found ({err})",
            hint="Check the id (owner/name) and your access to it; for a local file, give "
            "its path with a .jsonl, .json, .parquet, .txt or .npy suffix.",
            source=hub_id,
        ) from err
    except ConnectionError as err:
        raise DataError(
            f"the Hugging Face Hub is unreachable, so dataset {hub_id!r} cannot be loaded",
            hint=_OFFLINE_HINT,
            source=hub_id,
        ) from err
    except ValueError as err:
        named = f"subset {subset!r}, split {split!r}" if subset else f"split {split!r}"
        raise DataError(
            f"Hub dataset {hub_id!r} has no {named}: {err}",
            hint="Pick a subset and split that the dataset card lists.",
            source=hub_id,
        ) from err
