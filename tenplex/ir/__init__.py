"""The typed PTC IR: boxes, tensors, sub-tensors, partitions, allocations, topology."""

from tenplex.ir.box import Box, disjoint_union, row_major_boxes, subtract_all
from tenplex.ir.errors import (
    CompileError,
    ExecutionError,
    IRError,
    ParseError,
    PlanVerifyError,
    SpecError,
    TenplexError,
)
from tenplex.ir.ptc import PTC, Allocation, Partition, Value
from tenplex.ir.serialize import dumps, load_ptc, loads, ptc_from_json, ptc_to_json, save_ptc
from tenplex.ir.sweep import overlapping_pairs
from tenplex.ir.tensor import ITEMSIZE, Piece, SubTensor, TensorMeta, itemsize
from tenplex.ir.topology import Device, LinkClass, Links, Topology

__all__ = [
    "PTC", "Allocation", "Box", "CompileError", "Device", "ExecutionError", "IRError", "ITEMSIZE",
    "LinkClass", "Links", "ParseError", "Partition", "Piece", "PlanVerifyError", "SpecError",
    "SubTensor", "TenplexError", "TensorMeta", "Topology", "Value", "disjoint_union", "dumps",
    "itemsize", "load_ptc", "loads", "overlapping_pairs", "ptc_from_json", "ptc_to_json",
    "row_major_boxes", "save_ptc", "subtract_all",
]  # fmt: skip
