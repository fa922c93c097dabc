"""pagetrace: see PagedAttention, from the block table to the byte, through a real Triton kernel.

Light to import: the block-table and layout arithmetic is plain Python; torch and
triton load only when `paged_attention` (or the `run` command) is first used.
"""

from __future__ import annotations

from .errors import RuntimeFailure, UsageError
from .paging.blocks import TokenLocation, coverage, locate, slot_mapping
from .paging.layouts import LAYOUTS, make_geometry, vector_address
from .paging.lookup import trace_token

__version__ = "0.1.0"

__all__ = [
    "LAYOUTS",
    "RuntimeFailure",
    "TokenLocation",
    "UsageError",
    "coverage",
    "locate",
    "make_geometry",
    "paged_attention",
    "slot_mapping",
    "trace_token",
    "vector_address",
]


def __getattr__(name: str):
    if name == "paged_attention":
        from .attention.api import paged_attention

        return paged_attention
    raise AttributeError(f"module 'pagetrace' has no attribute {name!r}")
