"""Names and labels shared by the objects gputask emits (Jobs, DRA claims): fitted to Kubernetes' limits."""

from __future__ import annotations

import hashlib

API_VERSION = "gputask.io/v1alpha1"
TASK_LABEL = "gputask.io/task"
MAX_NAME = 63


def fit_name(base: str, limit: int = MAX_NAME) -> str:
    """``base`` if it fits ``limit`` chars, else a prefix plus a 10-hex hash of the whole."""
    if len(base) <= limit:
        return base
    digest = hashlib.sha256(base.encode()).hexdigest()[:10]
    return f"{base[: limit - 11].rstrip('-.')}-{digest}"
