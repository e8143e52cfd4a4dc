"""Where an agent keeps a job's state in its `TensorStore`.

    /job/<job>/<tag>/<device>/<subtensor id>               array of a sub-tensor instance
    /job/<job>/<tag>/<device>/.values/<partition>/<name>   typed value of a partition instance
    /job/<job>/<tag>/.manifest                             {"host", "devices"} (dst tags only)
    /job/<job>/<tag>/.meta/<name>                          records about the tag (its PTC, ...)
    /job/<job>/.staging-<dst tag>/...                      the dst tag being built

Sub-tensor ids contain `/` (`<partition>/<path>`), so they nest as directories; so do value names
(Megatron's `rng_state/shard_0.0_1.2`). A partition id is one component: its `%` and `/` are
escaped (`%25`, `%2F`), so a value's path parses back into its partition and name.
"""

from __future__ import annotations

from typing import Any

Instance = tuple[str, int]  # (sub-tensor id, device)


def tag_path(job: str, tag: str) -> str:
    return f"/job/{job}/{tag}"


def staging_tag(dst_tag: str) -> str:
    return f".staging-{dst_tag}"


def array_path(job: str, tag: str, device: int, subtensor: str) -> str:
    return f"{tag_path(job, tag)}/{device}/{subtensor}"


def value_path(job: str, tag: str, device: int, partition: str, name: str) -> str:
    return f"{tag_path(job, tag)}/{device}/.values/{_component(partition)}/{name}"


def _component(partition: str) -> str:
    return partition.replace("%", "%25").replace("/", "%2F")


def _partition(component: str) -> str:
    return component.replace("%2F", "/").replace("%25", "%")


def meta_path(job: str, tag: str, name: str) -> str:
    return f"{tag_path(job, tag)}/.meta/{name}"


def parse_leaf(job: str, tag: str, path: str) -> tuple[str, Any] | None:
    """("array", (subtensor, device)) or ("value", (partition, device, name)) for a leaf of a tag."""
    rest = path[len(tag_path(job, tag)) + 1 :].split("/")
    if len(rest) < 2 or not rest[0].isdigit():
        return None
    device = int(rest[0])
    if rest[1] == ".values":
        return "value", (_partition(rest[2]), device, "/".join(rest[3:]))
    return "array", ("/".join(rest[1:]), device)
