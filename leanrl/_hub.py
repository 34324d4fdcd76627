"""Is the Hugging Face hub usable? Answered in seconds, so that no network is a clear error at
once instead of the hub libraries' ~20 s of retries."""

from __future__ import annotations

import os
import re
import socket

__all__ = ["hub_offline", "hub_reachable"]

_TRUE = {"1", "true", "yes", "on"}


def hub_offline(*, datasets: bool = False) -> bool:
    """True when the user switched the hub off (``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1``,
    and, for datasets, ``HF_DATASETS_OFFLINE=1``)."""
    names = ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"] + (
        ["HF_DATASETS_OFFLINE"] if datasets else []
    )
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in names)


def hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP probe of the hub endpoint (``HF_ENDPOINT`` or huggingface.co); no data sent."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = re.sub(r"^\w+://", "", endpoint).split("/")[0]
    host, _, port = host.partition(":")
    try:
        with socket.create_connection((host, int(port or 443)), timeout=timeout):
            return True
    except OSError:
        return False
