"""What likely differs when a prediction of a server's KV events diverges (compare.py).

Three settings leave marks a comparison can read (vLLM's events carry block hashes, not block
ids, so the pool shows only through evictions):

- **block size**: the server's BlockStored events name their block size; the trace's header
  names the one it was recorded at.
- **the pool** (num_blocks): at the first divergence one side removes a cached block where the
  other stores one: the side that evicts ran out of free blocks first, so its pool is smaller.
- **the step budget** (max_num_batched_tokens, max_num_seqs): a trace recorded inside the
  server has a line per step with the tokens its scheduler ran (engines/vllm_trace.py). The
  first step where the server ran fewer tokens than the simulation is one where it admitted
  fewer than the simulated budget allows. (The events alone cannot tell: a message has no
  step number, steps without a new full block publish nothing, and a block fills at the same
  event whichever step computed its first tokens.)

Each hint is a dict: `setting`, the `simulated` value, the `server`'s where known, and `why`.
"""

from __future__ import annotations

from collections import Counter

from .events import BlockStored


def _first_other_step(steps, server_steps: dict[int, dict]) -> tuple[int, int, int] | None:
    """The first step the server's trace recorded with another token count than the simulation's:
    (step, the server's tokens, the simulation's)."""
    if not server_steps:
        return None
    ran = {s.step: s.tokens for s in steps}
    for k in sorted(server_steps):
        tokens = server_steps[k].get("tokens")
        if tokens is not None and ran.get(k, 0) != tokens:
            return k, tokens, ran.get(k, 0)
    return None


def likely_differences(pred, serv, agree: int, stream, trace, block_size: int, settings: dict, result_steps=()) -> list[dict]:
    out: list[dict] = []
    for key, o in (settings.get("overridden") or {}).items():  # a flag that contradicts the recording: the likeliest
        out.append({"setting": key, "simulated": o["given"], "server": o["server"],
                    "why": f"{o['source']} says the server ran with {key} {o['server']}; the simulation was given {o['given']}"})
    named = {h["setting"] for h in out}
    sizes = Counter(ev.block_size for b in stream.batches for ev in b.events if isinstance(ev, BlockStored))
    other = [size for size, _ in sizes.most_common() if size != block_size]
    if other and "block_size" not in named:
        out.append({"setting": "block_size", "simulated": block_size, "server": other[0],
                    "why": f"the server's BlockStored events hold {other[0]}-token blocks; the simulation's hold {block_size}"})
    header = getattr(trace, "header", None)
    if header is not None and header.block_size and header.block_size != block_size and not other and "block_size" not in named:
        out.append({"setting": "block_size", "simulated": block_size, "server": header.block_size,
                    "why": f"the trace's header says the server's blocks hold {header.block_size} tokens; the simulation's hold {block_size}"})
    a = pred[agree] if agree < len(pred) else None
    b = serv[agree] if agree < len(serv) else None
    pool = settings.get("num_blocks")
    if "num_blocks" in named:
        pass
    elif b is not None and b.kind == "removed" and (a is None or a.kind != "removed"):
        out.append({"setting": "num_blocks", "simulated": pool,
                    "why": f"the server evicted a cached block ({b.where}) where the simulated pool of {pool} blocks still had a free one: "
                           "the server's pool is likely smaller (vLLM logs its size at start: 'GPU KV cache size', num_gpu_blocks)"})
    elif a is not None and a.kind == "removed" and (b is None or b.kind != "removed"):
        out.append({"setting": "num_blocks", "simulated": pool,
                    "why": f"the simulation evicted a cached block ({a.where}) where the server did not: "
                           f"the server's pool is likely larger than {pool} blocks"})
    first = _first_other_step(result_steps, getattr(trace, "steps", None) or {})
    if first is not None and not named & {"max_num_batched_tokens", "max_num_seqs", "chunked_prefill"}:
        step, server, simulated = first
        budget, seqs = settings.get("max_num_batched_tokens"), settings.get("max_num_seqs")
        side = (f"the server admitted fewer tokens than the simulated budget allows (max_num_batched_tokens {budget}, "
                f"max_num_seqs {seqs}): one of its limits is likely smaller" if server < simulated else
                f"the server admitted more tokens in one step than the simulated budget (max_num_batched_tokens {budget}, "
                f"max_num_seqs {seqs}): one of its limits is likely larger")
        out.append({"setting": "max_num_batched_tokens", "simulated": budget, "step": step,
                    "why": f"at step {step} the server scheduled {server} tokens where the simulation scheduled {simulated}: {side}"})
    return out


__all__ = ["likely_differences"]
