"""Time the block-mapping diagram on the big case: a 4,096-block pool, 8 sequences of
32,768 tokens (2,048 blocks of 16 each), one token traced.

8 x 2,048 = 16,384 logical blocks do not fit in 4,096 physical ones unless sequences
share: all 8 share a 1,792-block prefix and own 256 blocks each (3,840 used, 256 free).
Two allocations: "contiguous" (each sequence's own blocks in one run) and "fragmented"
(own blocks drawn at random, the worst case for collapsing runs). A third, "sparse 2**22",
puts the same sequences in the largest pool the CLI takes (4,194,304 blocks), their own
blocks drawn at random from all of it: the work follows the used blocks, not the pool.
A fourth, "scattered 2**20", is `pagetrace diagram --tokens 8388608 --num-blocks 1048576`
without the CLI's plan: one sequence of 524,288 blocks drawn at random from 1,048,576, so
nearly every block is a run of its own; only the cells drawn become Python objects.
A fifth, "10,000 sequences", is a serving batch: 10,000 sequences of 1 to 64 blocks
scattered over a 2**20-block pool, every tenth sharing an 8-block prompt, one token
traced; 8 sequences are drawn and the other 9,992 summed up in one cell.

    python bench/bench_diagram.py [--repeats 3]

Prints the median seconds of each step: the cells, the DOT source, the terminal rendering,
SVG and PNG renders.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from pagetrace.views.diagram import MappingView, SequenceMap, dot_source, find_engine, layout_cells, render, terminal_mapping

NUM_BLOCKS, BLOCK_SIZE, NUM_SEQS, SEQ_LEN, PREFIX_BLOCKS = 4096, 16, 8, 32768, 1792
HUGE_POOL = 1 << 22


def big_case(fragmented: bool, seed: int = 0) -> MappingView:
    blocks_per_seq = SEQ_LEN // BLOCK_SIZE
    own = list(range(PREFIX_BLOCKS, NUM_BLOCKS))
    if fragmented:
        random.Random(seed).shuffle(own)
    prefix = list(range(PREFIX_BLOCKS))
    step = blocks_per_seq - PREFIX_BLOCKS
    tables = [prefix + own[s * step : (s + 1) * step] for s in range(NUM_SEQS)]
    return MappingView(
        BLOCK_SIZE, NUM_BLOCKS, [SequenceMap(f"seq {s}", SEQ_LEN, t) for s, t in enumerate(tables)], highlight=(3, 30000)
    )


def huge_case(seed: int = 0) -> MappingView:
    """The big case's sequences in a pool of 2**22 blocks, own blocks scattered over all of it."""
    step = SEQ_LEN // BLOCK_SIZE - PREFIX_BLOCKS
    own = random.Random(seed).sample(range(PREFIX_BLOCKS, HUGE_POOL), NUM_SEQS * step)
    prefix = list(range(PREFIX_BLOCKS))
    tables = [prefix + own[s * step : (s + 1) * step] for s in range(NUM_SEQS)]
    return MappingView(
        BLOCK_SIZE, HUGE_POOL, [SequenceMap(f"seq {s}", SEQ_LEN, t) for s, t in enumerate(tables)], highlight=(3, 30000)
    )


def scattered_case(seed: int = 0) -> MappingView:
    """One table of 524,288 blocks sampled from a pool of 1,048,576: half a million runs."""
    table = random.Random(seed).sample(range(1 << 20), 1 << 19)
    return MappingView(BLOCK_SIZE, 1 << 20, [SequenceMap("seq 0", BLOCK_SIZE << 19, table)], highlight=(0, 5_000_000))


def many_sequences_case(count: int = 10_000, seed: int = 0) -> MappingView:
    """`count` sequences of 1..64 blocks drawn at random from 2**20; every tenth shares a prompt."""
    rng = random.Random(seed)
    prompt = list(range(8))
    free = iter(rng.sample(range(8, 1 << 20), count * 64))
    sequences = []
    for s in range(count):
        table = (prompt if s % 10 == 0 else []) + [next(free) for _ in range(rng.randint(1, 64))]
        sequences.append(SequenceMap(f"seq {s}", BLOCK_SIZE * len(table) - rng.randrange(BLOCK_SIZE), table))
    return MappingView(BLOCK_SIZE, 1 << 20, sequences, highlight=(123, 5))


def print_terminal(view: MappingView) -> None:
    from rich.console import Console

    with open(os.devnull, "w") as sink:
        Console(file=sink, width=120).print(terminal_mapping(view))


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    engine = find_engine()
    if engine is None:
        raise SystemExit("no Graphviz engine: pip install graphviz-pure")
    print(f"engine: {engine[0]} ({engine[1]}); median of {args.repeats}")
    print(f"{'allocation':<17} {'cells':>7} {'edges':>6} {'layout s':>9} {'DOT s':>7} {'term s':>7} {'SVG s':>7} {'PNG s':>7} {'total SVG s':>12}")
    for name, view in (("contiguous", big_case(False)), ("fragmented", big_case(True)), ("sparse 2**22", huge_case()), ("scattered 2**20", scattered_case()), ("10,000 sequences", many_sequences_case())):
        cells = layout_cells(view)
        source = dot_source(view)
        t_layout = median_seconds(lambda: layout_cells(view), args.repeats)
        t_dot = median_seconds(lambda: dot_source(view), args.repeats)
        t_term = median_seconds(lambda: print_terminal(view), args.repeats)
        t_svg = median_seconds(lambda: render(source, "svg", engine), args.repeats)
        t_png = median_seconds(lambda: render(source, "png", engine), args.repeats)
        t_total = median_seconds(lambda: render(dot_source(view), "svg", engine), args.repeats)
        n_cells = cells.logical_cells + len(cells.pool)
        print(
            f"{name:<17} {n_cells:>7} {len(cells.edges):>6} {t_layout:>9.3f} {t_dot:>7.3f} {t_term:>7.3f} {t_svg:>7.3f} {t_png:>7.3f} {t_total:>12.3f}"
        )


if __name__ == "__main__":
    main()
