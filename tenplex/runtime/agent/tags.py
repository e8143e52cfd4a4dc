"""`TagCommands`: the agent's commands that read or rename whole tags of its store, apart from
executing plans (`agent.Agent`): `fetch`, `tag_meta`, `memory`, `delete_tag`, `rename_tag`,
`exists`. The class expects `self.store` (a `TensorStore`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tenplex.runtime.store.layout import Instance, meta_path, parse_leaf, tag_path


class TagCommands:
    store: Any

    def fetch(self, job: str, tag: str) -> tuple[dict[Instance, np.ndarray], dict[tuple[str, int], dict[str, Any]]]:
        """Copies of every array and value under a tag: ({(subtensor, device): array}, {(partition, device): values})."""
        arrays: dict[Instance, np.ndarray] = {}
        values: dict[tuple[str, int], dict[str, Any]] = {}
        if not self.store.exists(tag_path(job, tag)):
            return arrays, values
        for path in self.store.walk(tag_path(job, tag)):
            parsed = parse_leaf(job, tag, path)
            if parsed is None:
                continue
            kind, key = parsed
            if kind == "array":
                arrays[key] = np.array(self.store.get(path))
            else:
                values.setdefault(key[:2], {})[key[2]] = self.store.get(path)
        return arrays, values

    def tag_meta(self, job: str, tag: str) -> dict[str, Any]:
        """{name: record} of the tag's `.meta` records (empty when it has none)."""
        prefix = meta_path(job, tag, "")[:-1]
        if not self.store.exists(prefix):
            return {}
        return {p.rsplit("/", 1)[1]: self.store.get(p) for p in self.store.walk(prefix)}

    def memory(self, reset_peak: bool = False) -> dict[str, int]:
        """This process's resident bytes now and at peak (Linux VmRSS/VmHWM); `reset_peak`
        restarts the peak from now (/proc/self/clear_refs), to measure one execution."""
        if reset_peak:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        fields = {}
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    fields[key] = int(rest.split()[0]) * 1024
        return {"rss": fields["VmRSS"], "peak": fields["VmHWM"]}

    def delete_tag(self, job: str, tag: str) -> bool:
        """Delete `/job/<job>/<tag>` if present; True if it was."""
        if self.store.exists(tag_path(job, tag)):
            self.store.delete(tag_path(job, tag))
            return True
        return False

    def rename_tag(self, job: str, src: str, dst: str) -> bool:
        """Rename tag `src` to `dst`, replacing an older `dst`; False when `src` is absent."""
        if not self.store.exists(tag_path(job, src)):
            return False
        self.store.rename(tag_path(job, src), tag_path(job, dst), replace=True)
        return True

    def exists(self, path: str) -> bool:
        return self.store.exists(path)
