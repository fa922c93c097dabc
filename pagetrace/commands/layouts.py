"""`pagetrace layouts`: the one layout table, each entry as its formula, and (with vLLM
installed) which entry the installed engine's cache writer produces."""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import RuntimeFailure, UsageError
from ..paging.layouts import LAYOUTS, CacheGeometry, check_factors
from .lookup import BlockSizeOption, DtypeOption, HeadDimOption, KvHeadsOption
from .options import AliasChoice, ChoiceOption, IntOption

HELP = (
    "The cache layouts every command reads: for each, the factors of the key and value buffers in memory order "
    "and, for the dims given, each axis as shape:stride. --probe ISA runs vLLM's installed CPU cache writer on "
    "tagged keys and values and names the layout it wrote."
)
EPILOG = "Example: pagetrace layouts --block-size 32 --head-dim 64 --dtype bf16; pagetrace layouts --probe amx --probe vec (needs pagetrace[vllm])"

CPU_ISAS = ("vec", "vec16", "amx")


def layout_doc(geom: CacheGeometry) -> dict:
    lay = geom.layout
    return {
        "name": lay.name,
        "summary": lay.summary,
        "source": lay.source,
        "combined": lay.combined,
        "tiled": lay.tiled,
        "kernel": lay.kernel_ready,
        "raw_shape": list(geom.raw_shape()),
        **{which: {"factors": list(lay.factors(which)), "shape": list(geom.shape(which)), "formula": geom.formula(which)} for which in ("key", "value")},
    }


def table_docs(num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype: str, names: list[str] | None = None) -> tuple[list[dict], list[str]]:
    """Each layout's document for these dims, and the names of those the dims do not fit."""
    docs, skipped = [], []
    for name, lay in LAYOUTS.items():
        if names and name not in names:
            continue
        geom = CacheGeometry(lay, num_blocks, block_size, 1 if lay.single_head else kv_heads, head_dim, dtype)
        try:
            check_factors(geom)
        except ValueError as exc:
            skipped.append(f"{name}: {exc.reason}")
            continue
        docs.append(layout_doc(geom))
    return docs, skipped


def layouts(
    block_size: BlockSizeOption = 32,
    head_dim: HeadDimOption = 64,
    kv_heads: KvHeadsOption = 2,
    dtype: DtypeOption = "bf16",
    num_blocks: Annotated[int, IntOption(help="Blocks in the pool the formulas are printed for.")] = 4,
    layout: Annotated[list[str] | None, ChoiceOption(AliasChoice(LAYOUTS), help="Show only this layout (repeat for more).")] = None,
    probe: Annotated[list[str] | None, ChoiceOption(AliasChoice(CPU_ISAS), help="Probe vLLM's CPU cache writer with this ISA (repeat for more).")] = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the table as docs/layouts.md's Markdown (no dims) and nothing else.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object and nothing else on stdout.")] = False,
) -> None:
    import sys

    from ..paging.dtypes import canonical_dtype
    from ..paging.layouts import make_geometry, table_markdown
    from .output import emit_json, stdout_console

    if markdown:
        if json_output or probe:  # --json promises one JSON document; the probe prints its own result
            raise UsageError("--markdown", "", f"prints the table as Markdown and nothing else; drop {'--json' if json_output else '--probe'}")
        sys.stdout.write(table_markdown())
        return

    make_geometry("nhd", num_blocks, block_size, kv_heads, head_dim, dtype)  # the sizes, checked with their options
    dtype = canonical_dtype(dtype)
    docs, skipped = table_docs(num_blocks, block_size, kv_heads, head_dim, dtype, layout)
    probes = [run_probe(isa, block_size, kv_heads, head_dim, dtype) for isa in probe or ()]
    dims = {"num_blocks": num_blocks, "block_size": block_size, "kv_heads": kv_heads, "head_dim": head_dim, "dtype": dtype}
    if json_output:
        emit_json({"dims": dims, "layouts": docs, "not_shown": skipped, "probes": probes})
        return
    stdout_console().print(render_layouts(dims, docs, skipped, probes), highlight=False)


def run_probe(isa: str, block_size: int, kv_heads: int, head_dim: int, dtype: str) -> dict:
    """Which table entry vLLM's installed CPU writer produces for `isa` and these dims."""
    if dtype not in ("fp32", "fp16", "bf16"):
        raise UsageError("--dtype", dtype, "the probe writes fp32, fp16 or bf16 caches")
    try:
        import vllm._custom_ops  # noqa: F401 - loads vLLM's C++ ops
    except ImportError as exc:
        raise RuntimeFailure(f"--probe needs vLLM ({exc}); pip install 'pagetrace[vllm]'") from None
    from ..engines.probe import probe_vllm_cpu

    found = probe_vllm_cpu(isa, block_size, kv_heads, head_dim, dtype)
    import vllm

    return {"engine": "vllm", "version": vllm.__version__, **found.to_json()}


def render_layouts(dims: dict, docs: list[dict], skipped: list[str], probes: list[dict]):
    from rich.console import Group
    from rich.text import Text

    parts = [Text(
        f"layouts for {dims['num_blocks']} blocks of {dims['block_size']} slots, {dims['kv_heads']} KV head(s), head_dim "
        f"{dims['head_dim']}, {dims['dtype']}; each axis as shape:stride in elements (a split axis in CuTe's order, fastest part first); + the start of K or V",
        style="bold",
    )]
    for doc in docs:
        kind = "K and V in one buffer" if doc["combined"] else "a key and a value buffer"
        read = "tiled: read through a copy" if doc["tiled"] else ("the kernel takes it" if doc["kernel"] else "strided views")
        parts.append(Text(f"\n{doc['name']}  {doc['raw_shape']}  ({kind}; {read})", style="bold"))
        parts.append(Text(f"  {doc['summary']}"))
        for which in ("key", "value"):
            parts.append(Text(f"  {which:5} ({', '.join(doc[which]['factors'])})"))
            parts.append(Text(f"        {doc[which]['formula']}"))
        parts.append(Text(f"  from  {doc['source']}", style="dim"))
    for line in skipped:
        parts.append(Text(f"\nnot shown, {line}", style="dim"))
    for p in probes:
        also = f" (also explained: {', '.join(n for n in p['explained_by'] if n != p['layout'])})" if len(p["explained_by"]) > 1 else ""
        parts.append(Text(
            f"\nprobe: vLLM {p['version']} cpu_attn_reshape_and_cache, isa {p['isa']}: {p['elements']} tagged elements in "
            f"{p['scratch_blocks']} blocks, every one where '{p['layout']}' puts it{also}",
            style="bold green",
        ))
    return Group(*parts)
