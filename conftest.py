"""The doctests' namespace: every doctest (pytest ``--doctest-modules`` over functional_mesh/,
``--doctest-glob=*.md`` over docs/ and README.md) starts with ``fm`` (the package) and ``P``; one that
names ``torch`` gets it, and one that names ``rm`` or calls ``realize(`` runs as rank 5 of 8 on
torch's fake backend (which moves no data: the examples show shapes and types), with
``rm = fm.realize(fm.make_mesh((2, 4), ("dp", "tp")))``. After every doctest, the groups realize made
and the default group are destroyed, so nothing leaks to the next one. A doctest (a docs page) that
starts a process group of its own gets neither world nor ``rm`` from here: each page of docs/ keeps one
self-contained example for a reader to copy.
"""

import re

import pytest

_NAMES_TORCH = re.compile(r"\btorch\b")
_NEEDS_WORLD = re.compile(r"\brm\b|\brealize\(")


def _source(item) -> str:
    return "\n".join(example.source for example in item.dtest.examples)


@pytest.fixture(autouse=True)
def _doctest_world(request):
    from _pytest.doctest import DoctestItem

    if not isinstance(request.node, DoctestItem):
        yield
        return
    import functional_mesh as fm

    namespace = request.getfixturevalue("doctest_namespace")
    namespace.update(fm=fm, P=fm.P)
    source = _source(request.node)
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
        for name in ("rm", "torch"):
            namespace.pop(name, None)
        import sys

        if "torch.distributed" in sys.modules:
            import torch.distributed as dist

            if dist.is_initialized():
                fm.clear_cache()
                dist.destroy_process_group()
