import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagetrace.paging.blocks import check_table, coverage, locate, parse_int_list, slot_mapping
from pagetrace.errors import UsageError
from pagetrace.paging.plan import plan_tables


def test_worked_example_lookup():
    loc = locate(20, [7, 2, 15], 16)
    assert (loc.logical_block, loc.offset, loc.physical_block, loc.slot) == (1, 4, 2, 36)


def test_worked_example_coverage():
    spans = [(s.logical_block, s.physical_block, s.first_token, s.last_token) for s in coverage(38, [7, 2, 15], 16)]
    assert spans == [(0, 7, 0, 15), (1, 2, 16, 31), (2, 15, 32, 37)]


@given(st.integers(1, 64), st.lists(st.integers(0, 10_000), min_size=1, max_size=20, unique=True), st.data())
def test_locate_agrees_with_flat_enumeration(block_size, table, data):
    """Enumerate every slot of the table in order; the t-th one must be token t's slot."""
    flat = [p * block_size + o for p in table for o in range(block_size)]
    token = data.draw(st.integers(0, len(flat) - 1))
    assert locate(token, table, block_size).slot == flat[token]
    assert slot_mapping(len(flat), table, block_size) == flat


@pytest.mark.parametrize("text", ["7,,2", "a", "", " ", "7, 2", "7 2", "7,2,", ",7", "1.5", "0x3"])
def test_malformed_tables_are_refused(text):
    with pytest.raises(UsageError) as err:
        parse_int_list(text, "--table")
    assert err.value.option == "--table"


def test_table_checks():
    with pytest.raises(UsageError, match="physical block numbers are >= 0"):
        check_table([7, -1], None)
    with pytest.raises(UsageError, match="pool has 16 blocks"):
        check_table([7, 16], 16)
    with pytest.raises(UsageError, match="appears twice"):
        check_table([7, 2, 7], None)
    assert check_table([7, 2, 7], None, allow_repeats=True) == [7, 2, 7]


@pytest.mark.parametrize("token", [-1, 48])
def test_token_outside_capacity(token):
    with pytest.raises(UsageError, match="capacity 48"):
        locate(token, [7, 2, 15], 16)


def test_plan_defaults_reproduce_worked_example():
    plan = plan_tables([38], None, 16)
    assert plan.tables == [[7, 2, 15]] and plan.num_blocks == 16


def test_plan_grows_pool_and_extends_table_deterministically():
    a = plan_tables([5000, 70], None, 16, seed=3)
    b = plan_tables([5000, 70], None, 16, seed=3)
    assert a.tables == b.tables
    assert a.tables[0][:3] == [7, 2, 15] and len(a.tables[0]) == 313 and len(a.tables[1]) == 5
    used = [p for t in a.tables for p in t]
    assert len(set(used)) == len(used) and max(used) < a.num_blocks


def test_plan_marks_shared_and_repeated_blocks():
    plan = plan_tables([38, 20], [[7, 2, 15], [7, 3]], 16)
    assert plan.shared == {7: 2} and not plan.warnings
    plan = plan_tables([38], [[7, 7, 15]], 16)
    assert "more than once" in plan.warnings[0]


@pytest.mark.parametrize(
    "seq_lens, tables, num_blocks, option",
    [
        ([38, 10], [[7, 2, 15]], None, "--table"),
        ([38], [[7, 2]], None, "--table"),
        ([38], [[7, 2, 40]], 16, "--table"),
        ([0], None, None, "--tokens"),
        ([400], None, 4, "--num-blocks"),
    ],
)
def test_plan_refuses(seq_lens, tables, num_blocks, option):
    with pytest.raises(UsageError) as err:
        plan_tables(seq_lens, tables, 16, num_blocks)
    assert err.value.option == option


def test_sizes_are_bounded_before_any_work():
    import time

    from pagetrace.paging.blocks import MAX_BLOCKS

    start = time.perf_counter()
    with pytest.raises(UsageError) as err:
        plan_tables([10**12], None, 1)
    assert err.value.option == "--tokens"
    with pytest.raises(UsageError) as err:
        plan_tables([38], None, 16, num_blocks=MAX_BLOCKS + 1)
    assert err.value.option == "--num-blocks"
    with pytest.raises(UsageError) as err:
        check_table([MAX_BLOCKS], None)
    assert time.perf_counter() - start < 1


def test_length_an_exact_multiple_of_the_block_size():
    """48 tokens fill blocks 7, 2 and 15 exactly: the last block ends at token 47, no fourth block."""
    spans = [(s.logical_block, s.physical_block, s.first_token, s.last_token, s.used) for s in coverage(48, [7, 2, 15, 4], 16)]
    assert spans == [(0, 7, 0, 15, 16), (1, 2, 16, 31, 16), (2, 15, 32, 47, 16)]
    assert slot_mapping(48, [7, 2, 15], 16)[-1] == 15 * 16 + 15 and len(slot_mapping(48, [7, 2, 15], 16)) == 48
    assert locate(47, [7, 2, 15], 16).slot == 255
    with pytest.raises(UsageError):
        locate(48, [7, 2, 15], 16)
