"""Where a source is looked for, and the errors for sources that cannot be read."""

from __future__ import annotations

from pathlib import Path

import datasets.config
import numpy as np
import pytest

from llmc_trace.data import DataError, load_calibration, validate_source
from llmc_trace.data.source import resolve_source


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("Salesforce/wikitext", "hub"),
        ("wikitext", "hub"),
        ("owner/corpus-v1.2", "hub"),
        ("calib.jsonl", "local"),
        ("owner/name.parquet", "local"),
        ("./owner/name", "local"),
        ("/abs/path/data", "local"),
        ("notes.csv", "local"),
        ("a/b/c", "local"),
    ],
)
def test_source_is_hub_id_or_local_file(text: str, kind: str) -> None:
    if kind == "hub":
        resolved = resolve_source(text)
        assert (resolved.kind, resolved.hub_id, resolved.path) == ("hub", text, None)
    else:
        # Every local-looking name here is absent, so resolving reports a missing file.
        with pytest.raises(DataError, match="does not exist"):
            resolve_source(text)


def test_missing_file_says_so_before_any_work(tmp_path: Path) -> None:
    missing = tmp_path / "calib.jsonl"
    for check in (
        lambda: validate_source(missing, samples=4, seq_len=16),
        lambda: load_calibration(missing, None, samples=4, seq_len=16),
    ):
        with pytest.raises(DataError, match="does not exist") as caught:
            check()
        assert "Check the path" in caught.value.hint
        assert caught.value.source == str(missing)


def test_unknown_file_type_lists_supported_ones(tmp_path: Path) -> None:
    path = tmp_path / "calib.csv"
    path.write_text("text\nhello\n")
    with pytest.raises(DataError, match=r"unsupported type \('\.csv'\)") as caught:
        validate_source(path, samples=1, seq_len=16)
    for suffix in (".jsonl", ".json", ".parquet", ".txt", ".npy"):
        assert suffix in caught.value.hint


@pytest.mark.skipif(not Path("/proc/1/mem").exists(), reason="needs Linux's /proc")
@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".txt", ".parquet", ".npy"])
def test_unreadable_file_is_one_message_for_every_type(tmp_path: Path, suffix: str) -> None:
    """A link to another process's memory opens for no one (nor reads, for its owner): each
    reader would have raised its own OSError."""
    path = tmp_path / f"calib{suffix}"
    path.symlink_to("/proc/1/mem")
    for check in (
        lambda: validate_source(path, samples=1, seq_len=16),
        lambda: load_calibration(path, None, samples=1, seq_len=16),
    ):
        with pytest.raises(DataError) as caught:
            check()
        assert caught.value.message.startswith(f"data file {path} cannot be read (")
        assert "Make it readable by this user" in caught.value.hint
        assert caught.value.source == str(path)


def test_folder_is_not_a_source(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="is a folder") as caught:
        validate_source(tmp_path, samples=1, seq_len=16)
    assert "Name one file inside it" in caught.value.hint


def test_bad_sizes_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "tokens.npy"
    np.save(path, np.zeros((4, 8), dtype=np.int32))
    with pytest.raises(DataError, match="samples must be at least 1, got 0") as caught:
        validate_source(path, samples=0, seq_len=8)
    assert caught.value.param == "samples"
    with pytest.raises(DataError, match="seq_len must be at least 2, got 1"):
        load_calibration(path, samples=1, seq_len=1)
    with pytest.raises(DataError, match="batch_size must be at least 1, got 0"):
        load_calibration(path, samples=1, seq_len=8, batch_size=0)


def test_text_source_without_tokenizer_asks_for_one(write_records, lines: list[str]) -> None:
    path = write_records("jsonl", [{"text": line} for line in lines])
    with pytest.raises(DataError, match="no tokenizer was given") as caught:
        load_calibration(path, None, samples=1, seq_len=8)
    assert ".npy" in caught.value.hint


def test_unreachable_hub_suggests_a_local_file(monkeypatch: pytest.MonkeyPatch, tokenizer) -> None:
    # Offline mode fails at once where a machine without network retries for ~25 s first; both
    # reach `datasets`' ConnectionError, which is what is translated.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    for check in (
        lambda: validate_source("llmc-trace-tests/no-such-dataset", samples=4, seq_len=16),
        lambda: load_calibration(
            "llmc-trace-tests/no-such-dataset", tokenizer, samples=4, seq_len=16, split="train"
        ),
    ):
        with pytest.raises(DataError, match="Hugging Face Hub is unreachable") as caught:
            check()
        assert ".npy" in caught.value.hint and ".jsonl" in caught.value.hint
        assert caught.value.source == "llmc-trace-tests/no-such-dataset"


def test_an_unreachable_hub_is_found_out_before_the_client_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the probe finds the hub unreachable, the client runs offline: the same error at
    once, where its retries with backoff took about 28 s on a machine without network."""
    import time

    from llmc_trace.core import hub

    monkeypatch.setattr(hub, "hub_unreachable", lambda: "huggingface.co cannot be reached")
    offline = datasets.config.HF_HUB_OFFLINE
    start = time.perf_counter()
    with pytest.raises(DataError, match="Hugging Face Hub is unreachable"):
        validate_source("llmc-trace-tests/no-such-dataset", samples=4, seq_len=16)
    assert time.perf_counter() - start < 10
    assert datasets.config.HF_HUB_OFFLINE == offline  # offline for that call only


def test_hub_dataset_is_loaded_with_subset_and_split(
    monkeypatch: pytest.MonkeyPatch, tokenizer, lines: list[str]
) -> None:
    # No network here: the download is replaced by an in-memory Dataset; the rest is real.
    calls = []

    def load_dataset(path: str, name: str | None = None, *, split: str) -> datasets.Dataset:
        calls.append((path, name, split))
        return datasets.Dataset.from_dict({"id": list(range(len(lines))), "content": lines})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    calib = load_calibration(
        "owner/corpus",
        tokenizer,
        samples=3,
        seq_len=64,
        pack=False,
        shuffle=False,
        split="train[:10]",
        subset="python",
    )
    assert calls == [("owner/corpus", "python", "train[:10]")]
    rows = [batch["input_ids"][0].tolist() for batch in calib.batches]  # batch_size 1
    assert rows == [tokenizer(line, add_special_tokens=False)["input_ids"] for line in lines[:3]]


def test_missing_hub_dataset_and_split_are_data_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from datasets.exceptions import DatasetNotFoundError

    def not_found(*args: object, **kwargs: object) -> None:
        raise DatasetNotFoundError("Dataset 'owner/none' doesn't exist on the Hub")

    def bad_split(*args: object, **kwargs: object) -> None:
        raise ValueError("Unknown split \"tran\". Should be one of ['train'].")

    monkeypatch.setattr(datasets, "load_dataset_builder", not_found)
    with pytest.raises(DataError, match="'owner/none' was not found") as caught:
        validate_source("owner/none", samples=1, seq_len=8)
    assert "Check the id" in caught.value.hint
    monkeypatch.setattr(datasets, "load_dataset", bad_split)
    with pytest.raises(DataError, match="has no split 'tran': Unknown split") as caught:
        load_calibration("owner/corpus", object(), samples=1, seq_len=8, split="tran")
    assert "split" in caught.value.hint


def test_data_error_survives_pickling() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(DataError("bad", hint="fix it", source="x.jsonl", param="p")))
    assert (err.message, err.hint, err.source, err.param) == ("bad", "fix it", "x.jsonl", "p")


def test_data_errors_are_the_projects_bad_input() -> None:
    from llmc_trace.errors import BadInputError

    # The CLI maps BadInputError to exit code 2; DataError must be caught there, and as ValueError.
    assert issubclass(DataError, BadInputError) and issubclass(DataError, ValueError)


def test_a_saved_dataset_of_no_rows_says_so(tmp_path: Path) -> None:
    """datasets itself fails on one with an IndexError from deep inside its table code."""
    saved = tmp_path / "empty"
    datasets.Dataset.from_dict({"text": []}).save_to_disk(str(saved))
    with pytest.raises(DataError, match="holds no rows"):
        validate_source(saved, samples=4, seq_len=16)
