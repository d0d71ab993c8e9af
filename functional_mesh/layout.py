"""The layout algebra meshes are built on, as a public module (re-exported from ``_layout``).

One function per CuTe operation, linearised row-major; see docs/api.md ("The layout module").

Examples:
    >>> from functional_mesh.layout import Layout, complement, groups
    >>> complement(Layout((2, 3), (6, 1)), 12)
    Layout(2:3)
    >>> groups(Layout((2, 3), (6, 1)), 12).tolist()
    [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]]
"""

from ._layout import (
    Layout,
    coalesce,
    complement,
    composition,
    concat,
    cosize,
    decompose,
    groups,
    indices,
    is_injective,
    row_major,
    row_major_strides,
    size,
)

__all__ = ["Layout", "coalesce", "complement", "composition", "concat", "cosize", "decompose", "groups", "indices",
           "is_injective", "row_major", "row_major_strides", "size"]
