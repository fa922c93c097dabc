"""`lookup`'s combined K/V layouts (pagetrace/layouts.py) and the engines' strided views
(pagetrace/engines/views.py) describe the same engine allocations under two names each;
this pins that they put every element at the same byte, so the two tables cannot drift.
"""

import itertools

import pytest

from pagetrace.engines.views import ENGINE_LAYOUTS
from pagetrace.layouts import element_offset, make_geometry

# lookup's name -> the engines' name for the same allocation
SAME_MEMORY = {
    "flash": "flash-attn",
    "flashinfer": "flashinfer-nhd",
    "flashinfer-hnd": "flashinfer-hnd",
    "nhd": "nhd",
    "hnd": "hnd",
}

NB, BS, H, D = 5, 3, 2, 4


@pytest.mark.parametrize("lookup_name, engine_name", sorted(SAME_MEMORY.items()))
@pytest.mark.parametrize("dtype, size", [("fp16", 2), ("fp32", 4)])
def test_every_element_at_the_same_byte(lookup_name, engine_name, dtype, size):
    geom = make_geometry(lookup_name, NB, BS, H, D, dtype)
    key_view, value_view = ENGINE_LAYOUTS[engine_name].views(NB, BS, H, D, size)
    for which, view in (("key", key_view), ("value", value_view)):
        for block, slot, head, dim in itertools.product(range(NB), range(BS), range(H), range(D)):
            ours = element_offset(geom, which, block, slot, head, dim) * geom.element_size
            assert ours == view.byte(block, slot, head, dim), (which, block, slot, head, dim)
