"""Doctests of docs/*.md: a page that starts a fake process group must not leak it to the next."""

import pytest


@pytest.fixture(autouse=True)
def _no_process_group_leaks():
    yield
    import sys

    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        import functional_mesh as fm

        if dist.is_initialized():
            fm.clear_cache()
            dist.destroy_process_group()
