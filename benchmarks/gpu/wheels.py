"""Build the wheels the GPU run carries: what the GPU machine lacks, at the versions resolved here.

    python benchmarks/gpu/wheels.py                      # for the GPU machine's Python 3.12
    python benchmarks/gpu/wheels.py --python-version 3.11 --out /tmp/wheels   # this Python

The GPU machine has no package registry; its Python has torch, transformers and most of what
they need, but not compressed-tensors, datasets or the graphviz package
(``device_packages.txt``). This script walks the project's requirements (``pyproject.toml``)
through the distributions installed in the Python running it, and carries each one the
machine lacks, with that one's own requirements, at exactly the version installed here: the
versions the project's tests pass with. Except datasets (and with it dill and multiprocess):
the project imports it only to load a dataset from the hub, which the GPU machine cannot
reach, and its 0.8 MiB matter where the checkout alone is 59 of the 64 MiB a call carries
(``--python-version 3.11`` builds show 63.3 MiB with it). A requirement the machine meets only maybe is carried
too: one whose lower bound is the very version installed here (pydantic needs
``typing-extensions>=4.16.0``, the newest release this environment has, likely newer than an
image read earlier).

Each wheel is rebuilt from the installed files (its ``RECORD``), with no network, when its tags
fit the target Python; otherwise (a compiled extension, or a wheel made for one Python minor
version, such as multiprocess's ``py311``) it is downloaded for the target with ``pip download
--only-binary``. The project itself is built as a wheel from this checkout (setuptools, no
build isolation, no network) in a temporary copy, so the checkout gets no ``build/`` folder.

``manifest.json`` beside the wheels records each wheel, the target Python and a digest of the
project's sources: ``run.py`` refuses wheels built from other sources than the ones it runs
beside. The folder is rebuilt whole and replaced at the end (``benchmarks/gpu/wheels/``, which
git ignores); its size is checked against what a device call carries, 64 MiB with the
checkout.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_OUT = HERE / "wheels"
DEVICE_PACKAGES = HERE / "device_packages.txt"
#: what one device call carries: the checkout's files and the carried paths together
CARRY_LIMIT_BYTES = 64 * 2**20
#: the project's files that go into its wheel, and so into the source digest
SOURCE_FOLDERS = ("src/llmc_trace", "tracing_models")
SOURCE_FILES = ("pyproject.toml", "refmodel/__init__.py", "refmodel/train.py")
#: the platforms ``pip download`` may take a compiled wheel for (the device's README)
#: what the project requires but the GPU run never imports (see the module docstring)
NOT_CARRIED = frozenset({"datasets"})
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed, so a rebuild from the same files is byte-identical


def source_digest(repo: Path) -> str:
    """SHA-256 over the project's source files (paths and bytes, in sorted order), the
    caches left out: the same on every machine that holds the same sources."""
    digest = hashlib.sha256()
    paths = [repo / name for name in SOURCE_FILES]
    for folder in SOURCE_FOLDERS:
        paths += [p for p in (repo / folder).rglob("*") if p.is_file()]
    for path in sorted(paths):
        relative = path.relative_to(repo).as_posix()
        if "__pycache__" in relative or relative.endswith(".pyc"):
            continue
        digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def device_packages(path: Path = DEVICE_PACKAGES) -> set[str]:
    """The distributions the GPU machine's Python already has (comments and blanks skipped)."""
    lines = path.read_text().splitlines()
    return {canonical(line) for line in lines if line.strip() and not line.startswith("#")}


def carried(requirements: list[str], on_device: set[str], python_version: str) -> list[str]:
    """The distributions to carry for ``requirements`` (see the module docstring), sorted."""
    from packaging.requirements import Requirement

    environment = {"python_version": python_version, "extra": ""}
    chosen: set[str] = set()
    pending = list(requirements)
    while pending:
        requirement = Requirement(pending.pop())
        name = canonical(requirement.name)
        if name in chosen or name in NOT_CARRIED:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        installed = importlib.metadata.version(name)
        lower_bound_is_ours = any(
            spec.operator in (">=", "==") and spec.version == installed
            for spec in requirement.specifier
        )
        if name in on_device and not lower_bound_is_ours:
            continue
        chosen.add(name)
        pending += importlib.metadata.requires(name) or []
    return sorted(chosen)


def project_requirements(repo: Path) -> list[str]:
    return tomllib.loads((repo / "pyproject.toml").read_text())["project"]["dependencies"]


def wheel_tags(distribution: importlib.metadata.Distribution) -> list[str]:
    """The tags its installed ``WHEEL`` file records (the wheel it was installed from)."""
    text = distribution.read_text("WHEEL") or ""
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]


def fits(tag: str, python_version: str) -> bool:
    """Whether a wheel tagged ``tag`` installs on CPython ``python_version`` on Linux x86-64."""
    interpreters, abi, platform = tag.split("-")
    minor = int(python_version.split(".")[1])
    here = python_version.replace(".", "")

    def python_fits(interpreter: str) -> bool:
        if interpreter in ("py3", f"py{here}", f"cp{here}"):
            return True
        # a stable-ABI wheel built for CPython 3.N runs on every later 3.x
        return abi == "abi3" and interpreter.startswith("cp3") and int(interpreter[3:]) <= minor

    platform_fits = platform == "any" or all(
        p.startswith(("linux_", "manylinux")) and p.endswith("x86_64") for p in platform.split(".")
    )
    return (
        any(python_fits(i) for i in interpreters.split("."))
        and abi in ("none", "abi3", f"cp{here}")
        and platform_fits
    )


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def repack(distribution: importlib.metadata.Distribution, out: Path) -> Path:
    """A wheel of an installed distribution, rebuilt from the files its ``RECORD`` lists.

    Files outside its site-packages (console scripts; pip writes them again from
    ``entry_points.txt``), byte-code and the installer's own records are left out; the new
    ``RECORD`` hashes what the wheel holds.
    """
    name = distribution.metadata["Name"]
    version = distribution.version
    info = f"{canonical(name).replace('-', '_')}-{version}.dist-info"
    skipped_info = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
    entries: list[tuple[str, bytes]] = []
    for file in distribution.files or []:
        parts = file.parts
        if parts[0] == ".." or "__pycache__" in parts or file.suffix == ".pyc":
            continue
        if parts[0].endswith(".dist-info") and (len(parts) == 2 and parts[1] in skipped_info):
            continue
        arcname = file.as_posix()
        if parts[0].endswith(".dist-info"):
            arcname = "/".join((info, *parts[1:]))
        entries.append((arcname, Path(distribution.locate_file(file)).read_bytes()))
    entries.sort()
    record = "".join(f"{n},{record_hash(d)},{len(d)}\n" for n, d in entries)
    record += f"{info}/RECORD,,\n"
    tags = wheel_tags(distribution)
    interpreters = sorted({t.split("-")[0] for t in tags})
    abis = sorted({t.split("-")[1] for t in tags})
    platforms = sorted({t.split("-")[2] for t in tags})
    filename = (
        f"{canonical(name).replace('-', '_')}-{version}-"
        f"{'.'.join(interpreters)}-{'.'.join(abis)}-{'.'.join(platforms)}.whl"
    )
    path = out / filename
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for arcname, data in [*entries, (f"{info}/RECORD", record.encode())]:
            entry = zipfile.ZipInfo(arcname, ZIP_TIME)
            entry.compress_type = zipfile.ZIP_DEFLATED  # a ZipInfo's own default is stored
            archive.writestr(entry, data)
    return path


def download(name: str, version: str, python_version: str, out: Path) -> Path:
    """The registry's wheel of ``name==version`` for CPython ``python_version`` on Linux x86-64."""
    before = set(out.iterdir())
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    command += ["--only-binary=:all:", "--python-version", python_version]
    command += ["--implementation", "cp", "-d", str(out), f"{name}=={version}"]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    subprocess.run(command, check=True)
    (path,) = set(out.iterdir()) - before
    return path


def build_project(repo: Path, out: Path) -> Path:
    """The project's wheel, built by setuptools from a copy of its sources (no network)."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "project"
        copy.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(repo / name, copy / name)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for folder in ("src", "tracing_models"):
            shutil.copytree(repo / folder, copy / folder, ignore=ignore)
        (copy / "refmodel").mkdir()
        for name in ("__init__.py", "train.py"):
            shutil.copy2(repo / "refmodel" / name, copy / "refmodel" / name)
        command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
        command += ["--no-build-isolation", "--no-index", "-w", str(out), str(copy)]
        subprocess.run(command, check=True)
    (path,) = out.glob("llmc_trace-*.whl")
    return path


BLOCK_BYTES = 4096
"""Files count by the 4 KiB blocks they occupy: the device tool refused a tree of 63.9 MiB in
bytes (66.1 MiB in blocks) as over its 64 MiB."""

STAYS_BEHIND = ("refmodel/moe/model.safetensors",)
"""Tracked files no step of the run reads: moved aside for the call, they make room."""


def tracked_bytes(repo: Path, leaving: tuple[str, ...] = ()) -> int | None:
    """Bytes of the checkout's tracked files as a device call counts them (whole blocks), but
    for ``leaving``; None when git is not here."""
    try:
        listing = subprocess.run(
            ["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    names = [n for n in listing.decode().split("\0") if n and n not in leaving]
    return sum(_in_blocks((repo / n).stat().st_size) for n in names if (repo / n).is_file())


def _in_blocks(size: int) -> int:
    return -(-size // BLOCK_BYTES) * BLOCK_BYTES


def build(out: Path, python_version: str, repo: Path = REPO) -> dict:
    """Build the folder ``out`` from scratch (see the module docstring); returns its manifest."""
    names = carried(project_requirements(repo), device_packages(), python_version)
    staging = Path(tempfile.mkdtemp(prefix=".wheels-", dir=out.parent))
    try:
        wheels = {}
        for name in names:
            distribution = importlib.metadata.distribution(name)
            tags = wheel_tags(distribution)
            if tags and all(fits(tag, python_version) for tag in tags):
                path, how = repack(distribution, staging), "rebuilt from the installed files"
            else:
                path = download(name, distribution.version, python_version, staging)
                how = "downloaded"
            wheels[path.name] = {"name": name, "version": distribution.version, "from": how}
        project = build_project(repo, staging)
        version = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["version"]
        wheels[project.name] = {
            "name": "llmc-trace",
            "version": version,
            "from": "built from this checkout",
        }
        for path in staging.glob("*.whl"):
            wheels[path.name]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
            wheels[path.name]["bytes"] = path.stat().st_size
        manifest = {
            "python_version": python_version,
            "source_digest": source_digest(repo),
            "wheels": wheels,
            "bytes": sum(w["bytes"] for w in wheels.values()),
        }
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
        shutil.rmtree(out, ignore_errors=True)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the wheels folder")
    parser.add_argument(
        "--python-version", default="3.12", help="the Python the wheels are for (the GPU's: 3.12)"
    )
    args = parser.parse_args()
    manifest = build(args.out.resolve(), args.python_version)
    for filename, wheel in sorted(manifest["wheels"].items()):
        print(f"{filename:70} {wheel['bytes'] / 2**20:6.2f} MiB  {wheel['from']}")
    total = sum(_in_blocks(w["bytes"]) for w in manifest["wheels"].values())
    tracked = tracked_bytes(REPO)
    line = f"{len(manifest['wheels'])} wheels, {total / 2**20:.2f} MiB in {args.out}"
    if tracked is None:
        print(line)
        return
    print(
        f"{line}; with the checkout's tracked files ({tracked / 2**20:.1f} MiB) "
        f"{(tracked + total) / 2**20:.1f} MiB of the {CARRY_LIMIT_BYTES / 2**20:.0f} MiB a "
        "device call carries (files in whole 4 KiB blocks)"
    )
    if tracked + total <= CARRY_LIMIT_BYTES:
        return
    lighter = tracked_bytes(REPO, STAYS_BEHIND)
    assert lighter is not None
    if lighter + total > CARRY_LIMIT_BYTES:
        sys.exit("too large to carry: the device tool refuses a call over 64 MiB")
    aside = " ".join(STAYS_BEHIND)
    print(
        f"over the limit: move aside what no step reads ({aside}; then "
        f"{(lighter + total) / 2**20:.1f} MiB) for the call, and `git checkout -- {aside}` after"
    )


if __name__ == "__main__":
    main()
