"""What the run runs with: each package's version and the folder it is imported from, the
device, and every requirement of the carried wheels that the machine's packages do not meet.

On the GPU machine the carried wheels are installed into a target folder put first on the
path, beside the machine's own torch and transformers; a figure means little unless the JSON
says which llmc-trace (the wheel, or a checkout), which transformers and which device made it.
An unmet requirement is reported, not fatal: the steps then show whether it mattered.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
from pathlib import Path
from typing import Any

import torch
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion

#: import name -> distribution name, for every package the project imports
PACKAGES = {
    "torch": "torch",
    "transformers": "transformers",
    "tokenizers": "tokenizers",
    "huggingface_hub": "huggingface-hub",
    "safetensors": "safetensors",
    "compressed_tensors": "compressed-tensors",
    "pydantic": "pydantic",
    "datasets": "datasets",
    "graphviz": "graphviz",
    "networkx": "networkx",
    "numpy": "numpy",
    "rich": "rich",
    "click": "click",
    "psutil": "psutil",
    "llmc_trace": "llmc-trace",
}


def package_versions() -> dict[str, dict[str, str | None]]:
    """Each package's distribution version and the folder its module is imported from, found
    as the import system finds it (``find_spec``) without running the package: importing them
    all (transformers, datasets, compressed-tensors) took longer than the rest of the step."""
    found: dict[str, dict[str, str | None]] = {}
    for module_name, distribution in PACKAGES.items():
        spec = importlib.util.find_spec(module_name)
        if spec is None:
            found[distribution] = {"version": None, "location": None, "error": "not found"}
            continue
        try:
            version: str | None = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            version = None
        folders = list(spec.submodule_search_locations or [])
        location = folders[0] if folders else spec.origin and str(Path(spec.origin).parent)
        found[distribution] = {"version": version, "location": location}
    return found


def unmet_requirements(target: Path) -> list[str]:
    """Requirements of the distributions installed in ``target`` that no installed
    distribution meets, one sentence each (markers evaluated for this interpreter)."""
    unmet = []
    for distribution in sorted(
        importlib.metadata.distributions(path=[str(target)]), key=lambda d: d.metadata["Name"]
    ):
        name = distribution.metadata["Name"]
        for line in distribution.requires or []:
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            try:
                have = importlib.metadata.version(requirement.name)
            except importlib.metadata.PackageNotFoundError:
                unmet.append(f"{name} needs {requirement}; it is not installed")
                continue
            try:
                met = requirement.specifier.contains(have, prereleases=True)
            except InvalidVersion:
                met = False
            if not met:
                unmet.append(f"{name} needs {requirement}; found {have}")
    return unmet


def device_facts(device: torch.device) -> dict[str, Any]:
    """The device the steps measure on."""
    facts: dict[str, Any] = {"device": str(device), "cuda_available": torch.cuda.is_available()}
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        facts.update(
            name=properties.name,
            memory_bytes=properties.total_memory,
            multiprocessors=properties.multi_processor_count,
            capability=f"{properties.major}.{properties.minor}",
            cuda_runtime=torch.version.cuda,
        )
    else:
        facts["name"] = platform.processor() or platform.machine()
        facts["threads"] = torch.get_num_threads()
    return facts


def run(spec: dict[str, Any], save: Any) -> dict[str, Any]:
    target = spec.get("target")
    return {
        "python": platform.python_version(),
        "packages": package_versions(),
        "unmet_requirements": unmet_requirements(Path(target)) if target else [],
        "target": target,
        **device_facts(torch.device(spec["device"])),
    }
