"""A checkpoint or token file that cannot be what it claims exits 2 with the reason, never a
traceback, never a half-loaded model and never an output folder."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import PreTrainedTokenizerFast

from llmc_trace.cli.main import cli
from llmc_trace.models.source import resolve_model
from llmc_trace.oneshot import CompressRequest, compress

WEIGHTS = "model.safetensors"
LLAMA = "meta-llama/Llama-3.1-8B"


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--quiet", *args], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert "Traceback" not in result.output
    return result.exit_code, " ".join(result.output.split())


def drop_a_tensor(folder: Path) -> None:
    tensors = load_file(folder / WEIGHTS)
    tensors.pop("model.layers.1.mlp.up_proj.weight")
    save_file(tensors, folder / WEIGHTS, metadata={"format": "pt"})


def narrow_a_tensor(folder: Path) -> None:
    tensors = load_file(folder / WEIGHTS)
    name = "model.layers.0.mlp.up_proj.weight"
    tensors[name] = tensors[name][:, :10].contiguous()
    save_file(tensors, folder / WEIGHTS, metadata={"format": "pt"})


def store_as_integers(folder: Path) -> None:
    """What a broken conversion writes: every tensor cast to int8, no quantization_config."""
    tensors = load_file(folder / WEIGHTS)
    save_file({k: v.to(torch.int8) for k, v in tensors.items()}, folder / WEIGHTS)


def truncate(folder: Path) -> None:
    data = (folder / WEIGHTS).read_bytes()
    (folder / WEIGHTS).write_bytes(data[: len(data) // 2])


def pickle_only(folder: Path) -> None:
    torch.save(load_file(folder / WEIGHTS), folder / "pytorch_model.bin")
    (folder / WEIGHTS).unlink()


def lose_a_shard(folder: Path) -> None:
    tensors = load_file(folder / WEIGHTS)
    names = sorted(tensors)
    halves = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    for shard, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, folder / shard, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: s for s, keys in halves.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / WEIGHTS).unlink()
    (folder / "model-00002-of-00002.safetensors").unlink()


BROKEN: dict[str, tuple[Callable[[Path], None], str]] = {
    "missing tensor": (
        drop_a_tensor,
        "lacks 1 tensor(s) its config.json needs (model.layers.1.mlp.up_proj.weight)",
    ),
    "wrong shape": (
        narrow_a_tensor,
        "model.layers.0.mlp.up_proj.weight is (256, 10) in the file, (256, 128) by the config",
    ),
    "truncated": (truncate, "is not a readable safetensors file"),
    "integers": (store_as_integers, "is stored as torch.int8, and config.json names no"),
    "pickle only": (pickle_only, "only pickled weights (pytorch_model.bin)"),
    "lost shard": (
        lose_a_shard,
        "lacks 1 shard(s) its index names: model-00002-of-00002.safetensors",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
@pytest.mark.parametrize("command", ["evaluate", "compress", "attempt"])
def test_a_broken_checkpoint_exits_2_naming_what_is_wrong(
    saved_llama: tuple[Path, Path], tmp_path: Path, case: str, command: str
) -> None:
    folder, data = saved_llama
    break_it, expected = BROKEN[case]
    break_it(folder)
    out = tmp_path / "out"
    if command == "evaluate":
        code, output = invoke("evaluate", "-m", str(folder), "--data", str(data))
    elif command == "attempt":
        code, output = invoke("attempt", "-m", str(folder), "--real-weights")
    else:
        arguments = ["-m", str(folder), "-d", str(data), "-o", str(out), "--samples", "4"]
        code, output = invoke("compress", *arguments, "--seq-len", "32")
    assert code == 2, output
    assert expected in output and "--model" in output
    assert not out.exists() and not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_compressing_a_compressed_checkpoint_exits_2_saying_so(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    """Its tensors are integers and scales: the refusal says it is quantized already (not
    that weights are missing), before anything loads, and writes nothing."""
    folder, data = saved_llama
    first = tmp_path / "w4a16"
    arguments = ["-d", str(data), "--samples", "4", "--seq-len", "32"]
    code, output = invoke("compress", "-m", str(folder), "-o", str(first), *arguments)
    assert code == 0, output
    again = tmp_path / "again"
    code, output = invoke("compress", "-m", str(first), "-o", str(again), *arguments)
    assert code == 2, output
    assert "is already quantized (compressed-tensors" in output and "--model" in output
    assert "lacks" not in output and not again.exists()


def config_only(tmp_path: Path, folder: Path) -> Path:
    bare = tmp_path / "config-only"
    bare.mkdir()
    shutil.copy(folder / "config.json", bare / "config.json")
    return bare


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        (
            np.full((4, 32), 500, dtype=np.int32),
            "holds token ids from 500 to 500, outside [0, 128)",
        ),
        (np.full((4, 32), -1, dtype=np.int32), "holds token ids from -1 to -1, outside [0, 128)"),
        (np.array([{"ids": [1, 2]}], dtype=object), "is not a readable .npy array"),
        (np.zeros((2, 3, 4), dtype=np.int32), "holds a 3-D int32 array, not token ids"),
    ],
)
def test_evaluate_refuses_token_arrays_that_are_not_this_models(
    saved_llama: tuple[Path, Path], tmp_path: Path, tokens: np.ndarray, expected: str
) -> None:
    folder, _ = saved_llama
    bad = tmp_path / "bad.npy"
    np.save(bad, tokens, allow_pickle=True)
    code, output = invoke("evaluate", "-m", str(folder), "--data", str(bad))
    assert code == 2 and expected in output, output


def test_evaluate_refuses_missing_data_and_a_folder_without_weights(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data = saved_llama
    code, output = invoke("evaluate", "-m", str(folder), "-d", str(tmp_path / "none.npy"))
    assert code == 2 and "does not exist" in output  # -d as in compress
    bare = config_only(tmp_path, folder)
    code, output = invoke("evaluate", "-m", str(bare), "--data", str(data))
    assert code == 2 and "holds no weights" in output


def test_evaluate_scores_a_sound_checkpoint_as_before(saved_llama: tuple[Path, Path]) -> None:
    """The checks refuse only what is broken: the untouched folder still evaluates."""
    folder, data = saved_llama
    code, output = invoke("evaluate", "-m", str(folder), "--data", str(data), "--samples", "2")
    assert code == 0 and "perplexity" in output


def test_evaluate_shows_no_third_party_progress_bars(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    """The libraries' tqdm bars would cut through the command's own progress display on the
    same stderr: a real process (tqdm reads its settings when first imported) evaluating a
    W4A16 checkpoint prints the perplexity and none of transformers' bar for loading the
    weights or compressed-tensors' for applying the quantization config and dispatching the
    model (it asks for them explicitly); an empty ``TQDM_DISABLE=`` brings them back."""
    folder, data = saved_llama
    compress(
        CompressRequest(str(folder), str(data), str(tmp_path / "w4a16"), samples=2, seq_len=64)
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TQDM_")}

    def evaluate(**more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(Path(sys.executable).parent / "llmc-trace"), "evaluate", "-m",
             str(tmp_path / "w4a16"), "--data", str(data), "--samples", "2"],
            capture_output=True, text=True, timeout=300, env={**env, "COLUMNS": "200", **more},
        )  # fmt: skip

    quiet = evaluate()
    assert quiet.returncode == 0 and "perplexity" in quiet.stdout, quiet.stderr
    assert "it/s]" not in quiet.stderr, quiet.stderr
    asked = evaluate(TQDM_DISABLE="")
    assert "Applying quantization config" in asked.stderr and "it/s]" in asked.stderr


def test_a_sequence_longer_than_the_models_positions_exits_2(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data = saved_llama
    limit = json.loads((folder / "config.json").read_text())["max_position_embeddings"]
    too_long = str(limit + 1)
    code, output = invoke("attempt", "-m", str(folder), "--seq-len", too_long)
    assert code == 2 and f"exceed the {limit} positions" in output and "--seq-len" in output
    out = tmp_path / "out"
    code, output = invoke(
        "compress", "-m", str(folder), "-d", str(data), "-o", str(out), "--seq-len", too_long
    )
    assert code == 2 and f"exceed the {limit} positions" in output and not out.exists()


def test_an_output_that_cannot_be_written_exits_2_leaving_nothing(
    saved_llama: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path through a file (unwritable even for root: named, not "File exists") and a disk
    that fills at the rename."""
    folder, data = saved_llama
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    common = ["-m", str(folder), "-d", str(data), "--samples", "2", "--seq-len", "32"]
    in_the_way = f"lies under {blocker}, which is a file, not a folder"
    code, output = invoke("compress", *common, "-o", str(blocker / "out"))
    assert code == 2 and in_the_way in output and "--out" in output
    code, output = invoke(
        "render", "-m", "meta-llama/Llama-3.1-8B", "--out", str(blocker / "x.svg")
    )
    assert code == 2 and in_the_way in output

    def disk_full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("llmc_trace.checkpoint.writer.os.replace", disk_full)
    out = tmp_path / "out"
    code, output = invoke("compress", *common, "-o", str(out))
    assert code == 2 and "No space left on device" in output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "calib.npy", "tiny"]


def test_checkpoint_files_are_readable_by_other_users(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data = saved_llama
    out = tmp_path / "out"
    common = ["-m", str(folder), "-d", str(data), "--samples", "2", "--seq-len", "32"]
    code, output = invoke("compress", *common, "-o", str(out))
    assert code == 0, output
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert modes and set(modes.values()) == {0o644}, modes


def test_with_json_the_error_is_the_one_document_on_stdout(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, _ = saved_llama
    bad = tmp_path / "bad.npy"
    np.save(bad, np.full((2, 16), 999, dtype=np.int32))
    result = CliRunner().invoke(
        cli, ["--quiet", "evaluate", "-m", str(folder), "--data", str(bad), "--json"]
    )
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    assert document["exit_code"] == 2 and "outside [0, 128)" in document["error"]
    assert document["hint"]


@pytest.mark.parametrize("command", ["evaluate", "compress"])
def test_text_data_needs_a_tokenizer_without_remote_code(
    saved_llama: tuple[Path, Path], tmp_path: Path, command: str
) -> None:
    """compress loads the tokenizer before the model, as evaluate does: it crashed mid-run
    on a truncated tokenizer.json."""
    folder, _ = saved_llama
    text = tmp_path / "text.txt"
    text.write_text("def f ( x ) : return x + 1\n" * 50)
    arguments = [command, "-m", str(folder), "-d", str(text), "--samples", "2"]
    if command == "compress":
        arguments += ["-o", str(tmp_path / "out"), "--overwrite"]
    code, output = invoke(*arguments, "--seq-len", "16")
    assert code == 2 and "tokenizer does not load" in output and "--model" in output
    vocabulary = ["[UNK]", "</s>", "def", "f", "(", "x", ")", ":", "return", "+", "1"]
    tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(vocabulary)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", eos_token="</s>")
    fast.save_pretrained(folder)
    code, output = invoke(*arguments, "--seq-len", "16")
    assert code == 0, output  # the folder's own tokenizer loads
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    config["tokenizer_class"] = "EvilTokenizer"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    code, output = invoke(*arguments, "--seq-len", "16")
    assert code == 2 and "tokenizer does not load" in output and "custom code" in output


@pytest.mark.parametrize(
    ("option", "value"),
    [("--device-memory", "1.2.3GB"), ("--host-memory", "."), ("--device-memory", "-4GiB")],
)
def test_plan_refuses_a_memory_size_it_cannot_read(option: str, value: str) -> None:
    code, output = invoke("plan", "-m", "meta-llama/Llama-3.1-8B", option, value)
    assert code == 2 and "is not a memory size" in output and option in output


@pytest.mark.parametrize("command", ["attempt", "render", "plan"])
@pytest.mark.parametrize(
    ("option", "value"),
    [("--ignore", "re:["), ("--sequential-targets", "re:(model"), ("--ignore", "NoSuchClass")],
)
def test_tracing_options_that_match_nothing_exit_2_in_every_command(
    command: str, option: str, value: str, tmp_path: Path
) -> None:
    extra = ["--out", str(tmp_path / "x.svg")] if command == "render" else []
    code, output = invoke(command, "-m", "meta-llama/Llama-3.1-8B", option, value, *extra)
    assert code == 2 and option in output, output
    assert not (tmp_path / "x.svg").exists()


def test_compress_refuses_token_ids_outside_the_vocabulary(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, _ = saved_llama
    bad = tmp_path / "negative.npy"
    np.save(bad, np.full((4, 32), -3, dtype=np.int32))
    out = tmp_path / "out"
    code, output = invoke(
        "compress",
        "-m",
        str(folder),
        "-d",
        str(bad),
        "-o",
        str(out),
        "--samples",
        "2",
        "--seq-len",
        "32",
    )
    assert code == 2 and "holds token ids from -3 to -3, outside [0, 128)" in output
    assert not out.exists()


@pytest.mark.parametrize("kind", ["absolute", "relative", "home"])
def test_a_model_folder_that_does_not_exist_is_named_as_a_folder(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path that cannot be a hub id is reported as the missing folder it is, not as a hub
    id that failed to fetch."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    name = {"absolute": str(tmp_path / "gone"), "relative": "./gone", "home": "~/gone"}[kind]
    code, output = invoke("attempt", "-m", name)
    assert code == 2 and f"No folder at {name}." in output, output
    assert "Hugging Face Hub" not in output


@pytest.fixture
def unreachable_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub whose host never resolves (``.invalid`` is reserved for that), on any machine."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "https://hub.llmc-trace.invalid")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    for variable in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(variable, raising=False)


@pytest.mark.usefixtures("unreachable_hub")
def test_an_unreachable_hub_id_fails_at_once_suggesting_builtins_that_resemble_it() -> None:
    """Without network the answer comes from the resolver, not after the hub client's ~30 s
    of retries."""
    started = time.perf_counter()
    code, output = invoke("attempt", "-m", "Qwen/Qwen2-VL-2B-Instructt")
    assert time.perf_counter() - started < 10
    assert code == 2 and "hub.llmc-trace.invalid cannot be reached" in output, output
    assert "no copy is cached" in output and "closest: Qwen/Qwen2-VL-2B-Instruct" in output
    code, output = invoke("attempt", "-m", "nobody/zzzzzzzz")
    assert code == 2 and "closest" not in output and "e.g. " in output, output


@pytest.mark.usefixtures("unreachable_hub")
def test_an_unreachable_hub_still_serves_a_config_from_the_local_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub cache's layout (models--org--name/snapshots/<revision>, refs/main naming it)."""
    import huggingface_hub.constants

    repo = tmp_path / "models--someone--cached-llama"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    builtin = resolve_model(LLAMA).config_dict
    (snapshot / "config.json").write_text(json.dumps(builtin))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    code, output = invoke("plan", "-m", "someone/cached-llama", "--json")
    assert code == 0, output
    same_config = json.loads(invoke("plan", "-m", LLAMA, "--json")[1])
    assert json.loads(output)["estimates"] == same_config["estimates"]


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            {"model_type": "llama", "hidden_size": 100, "num_attention_heads": 3},
            "is not a valid 'llama' config: ValueError: The hidden size (100) is not a multiple "
            "of the number of attention heads (3)",
        ),
        (
            {"model_type": "llama", "hidden_size": "wide"},
            "is not a valid 'llama' config: TypeError: Field 'hidden_size' expected int",
        ),
        ({"model_type": "no_such_type"}, "does not know the model type 'no_such_type'"),
        (
            {"model_type": "own_code", "auto_map": {"AutoConfig": "configuration.OwnConfig"}},
            "asks for the checkpoint's own Python code (auto_map)",
        ),
    ],
    ids=["heads", "field-type", "unknown-type", "remote-code"],
)
def test_a_config_transformers_refuses_exits_2_with_its_reason(
    config: dict[str, object], expected: str, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, output = invoke("attempt", "-m", str(tmp_path))
    assert code == 2 and expected in output, output


def test_a_config_whose_check_crashes_in_transformers_exits_2_asking_for_a_newer_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers 5.17's rope check calls `.get` on a value Laguna's published config (read
    by 5.24) holds as an int: its validator crashes instead of refusing. Simulated here, where
    the release reads that config."""
    import llmc_trace.models.source as source

    def crashing(model_type: str, **values: object) -> None:
        raise AttributeError("'int' object has no attribute 'get'")

    monkeypatch.setattr(source.AutoConfig, "for_model", crashing)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "laguna"}))
    code, output = invoke("attempt", "-m", str(tmp_path))
    assert code == 2, output
    said = " ".join(output.split())
    assert "cannot read the config of" in said and "as a 'laguna' config" in said
    assert "(AttributeError: 'int' object has no attribute 'get')" in said
    assert "upgrade transformers (pip install -U transformers)" in said


@pytest.mark.parametrize("command", ["attempt", "plan", "compress"])
def test_a_config_json_that_is_no_object_or_cannot_be_read_exits_2_naming_it(
    command: str, tmp_path: Path
) -> None:
    """A JSON array where the settings belong, and a config.json that cannot be read (here a
    folder by that name, unreadable to any user), each get a sentence naming the file."""
    as_array, unreadable = tmp_path / "array", tmp_path / "unreadable"
    as_array.mkdir()
    (as_array / "config.json").write_text("[1, 2]")
    (unreadable / "config.json").mkdir(parents=True)
    extra = ["-d", str(tmp_path / "unused.npy"), "-o", str(tmp_path / "out")]
    for folder, said in (
        (as_array, "holds an array, not a JSON object"),
        (unreadable, "cannot be read"),
    ):
        code, output = invoke(command, "-m", str(folder), *(extra if command == "compress" else []))
        assert code == 2 and f"{folder / 'config.json'} {said}" in output, output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["compress", "evaluate", "attempt"])
def test_a_builtin_given_where_weights_are_needed_says_it_is_a_config(
    command: str, tmp_path: Path
) -> None:
    """Not "<the package's own folder> holds no weights": the name is a config, and a twin
    with weights is one line away."""
    name, data = "EleutherAI/gpt-j-6b", str(tmp_path / "unused.npy")
    arguments = {
        "compress": ["-d", data, "-o", str(tmp_path / "out")],
        "evaluate": ["-d", data],
        "attempt": ["--real-weights"],
    }[command]
    code, output = invoke(command, "-m", name, *arguments)
    assert code == 2 and f"{name} is a built-in config: it has no weights to" in output, output
    assert f"save_twin('{name}', 'twin')" in output and "llmc_trace/models" not in output


def test_the_twin_a_builtins_refusal_offers_compresses_from_a_text_file(tmp_path: Path) -> None:
    """The line the refusal prints runs as printed, for a text model too (save_twin wrote
    only twins of models with media processors), and its twin compresses from plain text."""
    import re
    import subprocess
    import sys

    from llmc_trace.data.drawn import CAPTION_WORDS

    name = "Qwen/Qwen3-0.6B"
    _, output = invoke("compress", "-m", name, "-d", "unused.txt", "-o", str(tmp_path / "out"))
    (line,) = re.findall(r'`python -c "(.+?)"`', output)
    subprocess.run([sys.executable, "-c", line], cwd=tmp_path, check=True, capture_output=True)
    words = np.random.default_rng(0).choice(CAPTION_WORDS, size=(32, 40))
    (tmp_path / "text.txt").write_text("\n".join(" ".join(row) for row in words))
    twin = tmp_path / "twin"
    config = json.loads((twin / "config.json").read_text())
    tokenizer = PreTrainedTokenizerFast.from_pretrained(twin)
    assert tokenizer.eos_token_id == config["eos_token_id"]
    assert len(tokenizer) == config["vocab_size"]
    code, output = invoke(
        "compress", "-m", str(twin), "-d", str(tmp_path / "text.txt"), "--samples", "4",
        "--seq-len", "32", "-o", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 0, output
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_an_empty_path_is_refused_as_empty_not_as_the_current_folder(tmp_path: Path) -> None:
    code, output = invoke("compress", "-m", str(tmp_path), "-d", "x.txt", "-o", "")
    assert code == 2 and "'--out' / '-o': is empty: give a path." in output, output


def test_a_refusal_names_the_flag_as_the_command_spells_it(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    """The data loaders report their parameter as `dataset`: compress's flag, an alias of
    evaluate's `--data`, which evaluate's refusal now names."""
    folder, _ = saved_llama
    missing = str(tmp_path / "missing.npy")
    code, output = invoke("evaluate", "-m", str(folder), "--data", missing)
    assert code == 2 and "Invalid value for --data:" in output, output
    code, output = invoke("compress", "-m", str(folder), "-d", missing, "-o", str(tmp_path / "o"))
    assert code == 2 and "Invalid value for --dataset:" in output, output


def test_a_quantization_config_that_does_not_fit_its_tensors_is_named(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    """Packed tensors have no dense counterpart to compare shapes with: the config is named,
    not transformers' pointer to a report its quieted logger never showed."""
    folder, data = saved_llama
    out = tmp_path / "w4"
    compress(CompressRequest(str(folder), out_dir=out, method="rtn", scheme="W4A16"))
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 8
    (out / "config.json").write_text(json.dumps(config))
    code, output = invoke("evaluate", "-m", str(out), "-d", str(data), "--samples", "2")
    assert code == 2 and "do not have the shapes its quantization_config implies" in output
    assert "above report" not in output
