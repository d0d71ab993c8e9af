"""The doctests' namespace, as JAX's root conftest gives its doctests one.

A docstring's doctest (pytest ``--doctest-modules`` over functional_mesh/) starts with ``fm`` (the
package) and ``P``; one that names ``torch`` gets it, and one that names ``rm`` or calls
``realize(`` runs as rank 5 of 8 on torch's fake backend (which moves no data: the examples show
shapes and types), with ``rm = fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))``; docs/api.md,
"Examples", tells readers so. A docstring that starts a process group of its own gets no world.
The pages of docs/ and README.md (``--doctest-glob=*.md``) get nothing from here: each keeps its own
imports and its own world in its first example, for a reader to copy. After every doctest, the
groups realize made and the default group are destroyed, so nothing leaks to the next one.
"""

import re

import pytest

_NAMES_TORCH = re.compile(r"\btorch\b")
_NEEDS_WORLD = re.compile(r"\brm\b|\brealize\(")


def _source(item) -> str:
    return "\n".join(example.source for example in item.dtest.examples)


@pytest.fixture(autouse=True)
def _doctest_world(request):
    from _pytest.doctest import DoctestItem, DoctestTextfile

    if not isinstance(request.node, DoctestItem):
        yield
        return
    import functional_mesh as fm

    namespace = request.getfixturevalue("doctest_namespace")
    page = isinstance(request.node.parent, DoctestTextfile)
    source = "" if page else _source(request.node)
    if not page:
        namespace.update(fm=fm, P=fm.P)
    if _NAMES_TORCH.search(source) or _NEEDS_WORLD.search(source):
        import torch

        namespace["torch"] = torch
    if _NEEDS_WORLD.search(source) and "init_process_group" not in source:
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", rank=5, world_size=8, store=FakeStore())
        namespace["rm"] = fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))
    try:
        yield
    finally:
        for name in ("fm", "P", "rm", "torch"):
            namespace.pop(name, None)
        import sys

        if "torch.distributed" in sys.modules:
            import torch.distributed as dist

            if dist.is_initialized():
                fm.clear_cache()
                dist.destroy_process_group()
