"""Bad multimodal input to `compress` and `evaluate` exits 2 with one sentence and writes
nothing; good input is scored on its text given the images."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from click.testing import CliRunner

from llmc_trace.cli.main import cli
from tests.cli.test_interrupts_cli import invoke

QWEN = "Qwen/Qwen2-VL-2B-Instruct"
AUDIO = "Qwen/Qwen2-Audio-7B-Instruct"


def _rows_with(drawn_rows: Path, folder: Path, image: str, payload: bytes | None = None) -> Path:
    """The drawn rows copied into ``folder`` with row 1's image replaced."""
    shutil.copytree(drawn_rows.parent / "images", folder / "images")
    rows = [json.loads(line) for line in drawn_rows.read_text().splitlines()]
    rows[1]["image"] = image
    if payload is not None:
        (folder / image).write_bytes(payload)
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _without_processor(twins, tmp_path: Path) -> Path:
    folder = shutil.copytree(twins(QWEN), tmp_path / "bare")
    for name in ("preprocessor_config.json", "processor_config.json", "tokenizer.json"):
        (folder / name).unlink()
    return folder


CASES = {
    "missing image": (
        lambda twins, rows, tmp: (twins(QWEN), _rows_with(rows, tmp, "images/nowhere.png")),
        "images/nowhere.png does not exist",
    ),
    "unreadable image path": (
        lambda twins, rows, tmp: (twins(QWEN), _rows_with(rows, tmp, "images")),
        "is not a file",
    ),
    "corrupt image": (
        lambda twins, rows, tmp: (
            twins(QWEN),
            _rows_with(rows, tmp, "images/bad.png", b"not an image"),
        ),
        "not an image Pillow can read",
    ),
    "no processor": (
        lambda twins, rows, tmp: (_without_processor(twins, tmp), rows),
        "has no processor",
    ),
    "images for an audio model": (
        lambda twins, rows, tmp: (twins(AUDIO), rows),
        "does not take image (it takes audio)",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_media_input_exits_2_writing_nothing(
    case: str, twins, drawn_rows: Path, tmp_path: Path
) -> None:
    make, said = CASES[case]
    folder, rows = make(twins, drawn_rows, tmp_path)
    out = tmp_path / "out"
    before = sorted(p.name for p in tmp_path.iterdir())
    code, output = invoke("compress", "-m", str(folder), "-d", str(rows), "-o", str(out),
                          "--samples", "6", "--seq-len", "512")  # fmt: skip
    assert code == 2 and said in output, output
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no output, no staging
    code, output = invoke("evaluate", "-m", str(folder), "--data", str(rows))
    assert code == 2 and said in output, output


def test_text_model_given_images_and_tokens_past_seq_len(
    saved_llama: tuple[Path, Path], twins, drawn_rows: Path, tmp_path: Path
) -> None:
    llama, _ = saved_llama
    out = tmp_path / "out"
    code, output = invoke("compress", "-m", str(llama), "-d", str(drawn_rows), "-o", str(out))
    assert code == 2 and "does not take image (it takes text only)" in output, output
    code, output = invoke("compress", "-m", str(twins(QWEN)), "-d", str(drawn_rows), "-o",
                          str(out), "--seq-len", "8")  # fmt: skip
    assert code == 2 and "placeholder tokens alone, more than seq_len=8" in output, output
    assert not out.exists()


def test_evaluate_scores_text_given_images(twins, drawn_rows: Path) -> None:
    folder = str(twins(QWEN))
    result = CliRunner().invoke(
        cli, ["--quiet", "evaluate", "-m", folder, "--data", str(drawn_rows), "--json"]
    )
    assert result.exit_code == 0, result.output
    image = json.loads(result.stdout)
    assert image["modality"] == "image" and image["num_tokens"] > 0  # detected from the rows
    code, output = invoke(
        "evaluate", "-m", folder, "--data", str(drawn_rows), "--modality", "audio"
    )
    assert code == 2 and "audio" in output, output


def test_evaluate_reads_the_columns_named_as_compress_does(twins, drawn_rows: Path, tmp_path):
    """Columns named `picture` and `sentence` are scored, through --image-column and
    --text-column, exactly as the same rows under the names found by default."""
    shutil.copytree(drawn_rows.parent / "images", tmp_path / "images")
    renamed = tmp_path / "renamed.jsonl"
    renamed.write_text(
        "".join(
            json.dumps({"picture": row["image"], "sentence": row["text"]}) + "\n"
            for row in map(json.loads, drawn_rows.read_text().splitlines())
        )
    )
    folder = str(twins(QWEN))

    def scored(*args: str) -> dict:
        result = CliRunner().invoke(cli, ["--quiet", "evaluate", "-m", folder, *args, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    named = scored("--data", str(renamed), "--image-column", "picture", "--text-column", "sentence")
    found = scored("--data", str(drawn_rows))
    assert named["modality"] == found["modality"] == "image"
    assert (named["perplexity"], named["num_tokens"]) == (found["perplexity"], found["num_tokens"])
    code, output = invoke("evaluate", "-m", folder, "--data", str(renamed))
    assert code == 2 and "--text-column" in output, output
