"""Job specs: a compact one-line syntax and a JSON file form, both giving model + parallel + cluster.

Compact: `MODEL[:OPTS]@HOSTSxGPUS[+FIRST_HOST]`, OPTS comma-separated, e.g.
`gpt-1.3b:tp2,pp2,dp2@4x4`, `llama-tiny:tp2,pp2,vpp2,zero1@2x4`, `gpt-tiny:tp2,pp2,dp1@1x4+1`
(first host 1: devices start at 4, hosts h1, h2, ...). Options:

- `tpN ppN dpN vppN epN zeroN`: parallel sizes (dp defaults to filling the cluster);
- `sp`: sequence parallelism; `noopt`: no optimizer state;
- `first=N`, `last=N`: uneven first/last stage layer counts; `stages=A/B/...`: per-stage counts;
- `order=tp-dp-pp`: rank order, fastest-varying axis first (default Megatron's; e.g. `tp-pp-dp`);
- `FIELD=VALUE`: a model field override (`layers`, `hidden`, `heads`, `groups`, `ffn`, `vocab`,
  `experts`, `dtype`, or any ModelSpec field name), e.g. `layers=8,hidden=256,dtype=float16`.

JSON: `{"model": "<preset>" | {"preset": "<preset>", FIELD: VALUE...} | {FIELD: VALUE...},
"parallel": {tp, pp, dp, vpp, zero, ep, sp, first, last, stage_layers},
"cluster": {hosts, gpus_per_host, first_host, first_device}}`.

Errors are `SpecError`s that name the spec (or file) and the bad token or field.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs

from tenplex.frontends.model import LIMITS, ModelSpec
from tenplex.frontends.parallel import MAX_DEVICES, Cluster, ParallelConfig, fit
from tenplex.frontends.presets import MODEL_FIELDS, PRESETS, model_from_fields, preset
from tenplex.frontends.transformer import build_ptc
from tenplex.ir.errors import SpecError
from tenplex.ir.files import read_json
from tenplex.ir.ptc import PTC

ALIASES = {
    "layers": "num_layers",
    "groups": "query_groups",
    "ffn": "ffn_hidden",
    "experts": "num_experts",
    "pos": "max_position",
    "bias": "bias_linear",
    "tied": "tied_embeddings",
}
_SIZE = re.compile(r"(tp|pp|dp|vpp|ep|zero)(\d+)", re.ASCII)
_CLUSTER = re.compile(r"(\d+)x(\d+)(?:\+(\d+))?", re.ASCII)
_FIELD_TYPES = {a.name: a.type for a in attrs.fields(ModelSpec)}


@attrs.frozen
class JobSpec:
    model: ModelSpec
    parallel: ParallelConfig
    cluster: Cluster

    def build(self) -> PTC:
        return build_ptc(self.model, self.parallel, self.cluster)


def _short(text: str, most: int = 40) -> str:
    return text if len(text) <= most else text[: most - 3] + "..."


def _int(key: str, text: str, token: str, where: str = "option") -> int:
    """A decimal count. One of more than 18 digits is over every limit: refused before int()
    (which stops at 4300 digits) with the limit of `key`."""
    if not (text.isascii() and text.isdecimal()):
        raise SpecError(f"{where} {_short(token)!r}: {key} needs a non-negative integer, got {_short(text)!r}")
    if len(text.lstrip("0")) > 18:
        limit = LIMITS.get(ALIASES.get(key, key), LIMITS["num_layers"] if key in ("first", "last", "stages") else MAX_DEVICES)
        raise SpecError(f"{where} {_short(token)!r}: {key}={_short(text)} ({len(text)} digits) exceeds the limit {limit}")
    return int(text)


def _field(field: str, text: str, token: str) -> Any:
    kind = _FIELD_TYPES[field]
    if kind == "int":
        return _int(field, text, token)
    if kind == "bool":
        if text not in ("true", "false", "1", "0"):
            raise SpecError(f"option {_short(token)!r}: {field} needs true or false, got {_short(text)!r}")
        return text in ("true", "1")
    return text


def _setting(token: str, sizes: dict[str, Any], fields: dict[str, Any]) -> None:
    key, text = token.split("=", 1)
    field = ALIASES.get(key, key)
    if key in ("first", "last"):
        sizes[key] = _int(key, text, token)
    elif key == "order":
        sizes["order"] = text
    elif key == "stages":
        sizes["stage_layers"] = tuple(_int("stages", part, token) for part in text.split("/"))
    elif field in MODEL_FIELDS:
        fields[field] = _field(field, text, token)
    else:
        raise SpecError(f"option {_short(token)!r}: unknown setting {_short(key)!r}")


def _option(token: str, sizes: dict[str, Any], fields: dict[str, Any]) -> None:
    if m := _SIZE.fullmatch(token):
        sizes[m[1]] = _int(m[1], m[2], token)
    elif token == "sp":
        sizes["sp"] = True
    elif token == "noopt":
        fields["optimizer"] = "none"
    elif "=" in token:
        _setting(token, sizes, fields)
    else:
        raise SpecError(f"option {_short(token)!r} is not one of tpN ppN dpN vppN epN zeroN sp noopt KEY=VALUE")


def parse_spec(text: str) -> JobSpec:
    """A JobSpec from the compact syntax. Raises SpecError naming the spec and the bad token."""
    try:
        return _parse(text.strip())
    except SpecError as e:
        raise SpecError(f"spec {_short(text, 80)!r}: {e}") from None


def _parse(text: str) -> JobSpec:
    head, at, where = text.rpartition("@")
    if not at:
        raise SpecError("missing '@HOSTSxGPUS' cluster part")
    m = _CLUSTER.fullmatch(where)
    if not m:
        raise SpecError(f"cluster {_short(where)!r} is not HOSTSxGPUS or HOSTSxGPUS+FIRST_HOST")
    cluster = Cluster(*(_int(k, v, where, "cluster") for k, v in zip(("hosts", "gpus_per_host", "first_host"), (m[1], m[2], m[3] or "0"))))
    name, _, opts = head.partition(":")
    sizes: dict[str, Any] = {}
    fields: dict[str, Any] = {}
    for token in filter(None, opts.split(",")):
        _option(token, sizes, fields)
    model = preset(name, **fields)
    parallel = ParallelConfig(**sizes)
    return JobSpec(model, fit(model, parallel, cluster), cluster)


def _section(root: dict, key: str, source: str) -> dict:
    node = root.get(key)
    if not isinstance(node, dict):
        raise SpecError(f"{source}: {key}: expected an object, got {node!r}")
    return node


def _json_model(node: Any, source: str) -> ModelSpec:
    if isinstance(node, str):
        node = {"preset": node}
    if not isinstance(node, dict):
        raise SpecError(f"{source}: model: expected a preset name or an object, got {node!r}")
    fields = dict(node)
    name = fields.pop("preset", None)
    if name is not None:
        if not isinstance(name, str) or name not in PRESETS:
            raise SpecError(
                f"{source}: model.preset: unknown model preset {name!r} (known: {', '.join(sorted(PRESETS))})"
            )
        fields = {**PRESETS[name], **fields}
    return model_from_fields(fields, where=f"{source}: model")


def _build(source: str, section: str, make: Any, node: dict) -> Any:
    allowed = [f.name for f in attrs.fields(make) if f.init]
    unknown = sorted(set(node) - set(allowed))
    if unknown:
        raise SpecError(f"{source}: {section}: unknown key {unknown[0]!r} (allowed: {', '.join(allowed)})")
    try:
        return make(**node)
    except TypeError as e:  # an unknown or missing key
        raise SpecError(f"{source}: {section}: {e}") from None
    except SpecError as e:
        raise SpecError(f"{source}: {section}: {e}") from None


def spec_from_json(root: Any, source: str = "<spec>") -> JobSpec:
    """A JobSpec from a decoded JSON document. Raises SpecError naming `source` and the field."""
    if not isinstance(root, dict):
        raise SpecError(f"{source}: expected an object with model, parallel, cluster")
    unknown = sorted(set(root) - {"model", "parallel", "cluster"})
    if unknown:
        raise SpecError(f"{source}: unknown key {unknown[0]!r} (allowed: model, parallel, cluster)")
    model = _json_model(root.get("model"), source)
    parallel = _build(source, "parallel", ParallelConfig, _section(root, "parallel", source))
    cluster = _build(source, "cluster", Cluster, _section(root, "cluster", source))
    try:
        return JobSpec(model, fit(model, parallel, cluster), cluster)
    except SpecError as e:
        raise SpecError(f"{source}: {e}") from None


def load_spec(path: str | Path) -> JobSpec:
    return spec_from_json(read_json(path, SpecError), str(path))


def job_from_spec(text_or_path: str | Path) -> JobSpec:
    """A JSON file path (an existing file, or a name ending in .json) or a compact spec."""
    text = str(text_or_path)
    try:
        is_file = Path(text).is_file()
    except (OSError, ValueError):  # a name too long for a path (or with a NUL) is no file
        is_file = False
    if text.endswith(".json") or is_file:
        return load_spec(text)
    return parse_spec(text)


def ptc_from_spec(text_or_path: str | Path) -> PTC:
    """The PTC of a compact spec or a JSON spec file. Raises SpecError."""
    return job_from_spec(text_or_path).build()
