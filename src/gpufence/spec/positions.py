"""Where items sit in a cluster file, for messages that point at them: queue name -> its index in
``queues:``. (The Cluster keeps queues by name, grouped by partition, not in file order.)"""

from __future__ import annotations

import os
from pathlib import Path

import yaml


def queue_positions(path: str | os.PathLike[str]) -> dict[str, int]:
    """Queue name -> its index in the file's ``queues:`` list; {} if unreadable."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    queues = data.get("queues") if isinstance(data, dict) else None
    if not isinstance(queues, list):
        return {}
    return {str(q["name"]): i for i, q in enumerate(queues) if isinstance(q, dict) and "name" in q}
