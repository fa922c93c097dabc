"""How fast pagetrace reads vLLM's KV events: decoding against msgspec's raw decode.

    python bench/bench_events.py                 # 200,000 events in 20,000 messages
    python bench/bench_events.py --quick         # 20,000 events

Messages are encoded with vLLM's own classes (vllm.distributed.kv_events; maps tagged
"type", as vLLM 0.32 sends them), or, without vLLM, with plain maps of the same fields.
Each message is one step's batch: BlockStored of one to four 32-token blocks and
BlockRemoved of one hash, alternating. Timed: `read_messages` (decode, check, build
pagetrace's events, sequence numbers), and as the baseline msgspec's untyped decode of the
same payloads alone. A server publishing 10,000 events a second needs 10,000 events/s.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec  # noqa: E402

from pagetrace.sim.events import read_messages  # noqa: E402


def messages(n_events: int, per_message: int = 10) -> list[list[bytes]]:
    try:
        from vllm.distributed import kv_events as kv
    except ImportError:
        kv = None
    enc = msgspec.msgpack.Encoder()
    out, h = [], 1 << 40
    for seq in range(n_events // per_message):
        evs = []
        for k in range(per_message):
            blocks = 1 + (seq + k) % 4
            if k % 2 == 0:
                fields = dict(block_hashes=list(range(h, h + blocks)), parent_block_hash=h - 1, token_ids=list(range(32 * blocks)),
                              block_size=32, lora_id=None, medium="GPU", lora_name=None, extra_keys=[None] * blocks, group_idx=0,
                              kv_cache_spec_kind="full_attention")
                evs.append(kv.BlockStored(**fields) if kv else {"type": "BlockStored", **fields})
                h += blocks
            else:
                evs.append(kv.BlockRemoved(block_hashes=[h - 7], medium="GPU", group_idx=0) if kv else
                           {"type": "BlockRemoved", "block_hashes": [h - 7], "medium": "GPU", "group_idx": 0})
        batch = kv.KVEventBatch(ts=time.time(), events=evs, data_parallel_rank=0) if kv else [time.time(), evs, 0]
        out.append([b"kv-events", seq.to_bytes(8, "big"), enc.encode(batch)])
    return out, kv is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 20_000 if args.quick else args.events
    msgs, with_vllm = messages(n)
    dec = msgspec.msgpack.Decoder()
    best_raw = best_ours = float("inf")
    for _ in range(3):  # alternate, best of three each
        t = time.perf_counter()
        for m in msgs:
            dec.decode(m[2])
        best_raw = min(best_raw, time.perf_counter() - t)
        t = time.perf_counter()
        stream = read_messages(((f"m{i}", m) for i, m in enumerate(msgs)), "bench")
        best_ours = min(best_ours, time.perf_counter() - t)
    assert stream.num_events == len(msgs) * 10 and not stream.problems and not stream.gaps
    events = stream.num_events
    print(f"{events:,} events in {len(msgs):,} messages ({'vLLM classes' if with_vllm else 'plain maps'}), "
          f"Python {platform.python_version()}, {platform.machine()}")
    print(f"msgspec raw decode: {best_raw * 1e3:.1f} ms, {events / best_raw:,.0f} events/s")
    print(f"pagetrace read_messages: {best_ours * 1e3:.1f} ms, {events / best_ours:,.0f} events/s "
          f"({best_ours / best_raw:.1f}x the raw decode)")


if __name__ == "__main__":
    main()
