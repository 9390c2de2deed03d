"""Whether the Hugging Face Hub can be reached, asked once in milliseconds before a hub client
would spend half a minute retrying to find out, and the offline mode that then reads its
local cache alone."""

from __future__ import annotations

import contextlib
import os
import socket
import urllib.parse
from collections.abc import Iterator

from huggingface_hub import constants as hub_constants

_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def hub_unreachable() -> str | None:
    """Why the hub cannot be reached, or ``None`` where it may be. A machine without network
    learns it from its resolver in milliseconds, where the hub client retries with backoff
    for about 30 s before saying the same. Behind a proxy only the client knows the way, so
    no probe is made there."""
    if hub_constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(variable) for variable in _PROXY_VARIABLES):
        return None
    endpoint = urllib.parse.urlsplit(hub_constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=5).close()
    except OSError as err:
        return f"{endpoint.hostname} cannot be reached: {err.strerror or err}"
    return None


@contextlib.contextmanager
def offline_if_unreachable() -> Iterator[None]:
    """Run the body in the hub clients' offline mode where the hub cannot be reached: a
    dataset in the local cache still loads, any other fails at once with the clients' own
    offline error instead of retrying with backoff."""
    if hub_unreachable() is None:
        yield
        return
    import datasets

    flags = (hub_constants, datasets.config)  # each client reads its own copy of the flag
    before = [owner.HF_HUB_OFFLINE for owner in flags]
    for owner in flags:
        owner.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        for owner, value in zip(flags, before):
            owner.HF_HUB_OFFLINE = value
