"""One of 8 gloo workers: a few training steps through accelerate's ``Accelerator`` with FSDP2 (HSDP 2 x 4).

    torchrun --nproc_per_node=8 tests/accelerate/_accelerator_worker.py {accelerate|ours}

"accelerate": the mesh is accelerate's own (``ParallelismConfig.build_device_mesh``); "ours": the
same config adopted by ``functional_mesh.integrations.accelerate.adopt`` first. Everything else --
``Accelerator.prepare`` (which applies FSDP2 over ``mesh[config.fsdp_dim_names]``),
``accelerator.backward``, ``clip_grad_norm_``, the optimizer -- is accelerate's. Each rank prints
``RESULT rank=<r> groups=<n> loss=<...> grad_norm=<...>`` per step (``repr`` of the floats, for a
bit-for-bit comparison by tests/accelerate/test_gloo.py).

accelerate 1.15 refuses a ``ParallelismConfig`` on CPU: its state sets ``MULTI_CPU`` whatever
the FSDP plugin says, and the config then accepts only FSDP2 or GPU types. :func:`fsdp_on_cpu`
is the small wrapper around its state setup that keeps the FSDP type (and the plugin) on CPU.
"""

from __future__ import annotations

import sys
import warnings

import torch
import torch.distributed as dist


def fsdp_on_cpu() -> None:
    """Let ``AcceleratorState`` keep ``DistributedType.FSDP`` when it lands on ``MULTI_CPU`` with an FSDP plugin."""
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin

    AcceleratorState.__init__ = init


def main(which: str) -> None:
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo")
    fsdp_on_cpu()
    from accelerate import Accelerator
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import FullyShardedDataParallelPlugin

    before = dist.distributed_c10d._world.group_count
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=4)
    if which == "ours":
        from functional_mesh.integrations import accelerate as fm_accelerate

        fm_accelerate.adopt(config, "cpu")
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=True)
    accelerator = Accelerator(parallelism_config=config, fsdp_plugin=plugin, cpu=True)
    groups = dist.distributed_c10d._world.group_count - before
    assert accelerator.is_fsdp2, accelerator.distributed_type

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    g = torch.Generator().manual_seed(dist.get_rank())
    for step in range(3):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        norm = accelerator.clip_grad_norm_(model.parameters(), 1e9)
        optimizer.step()
        optimizer.zero_grad()
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        print(f"RESULT rank={dist.get_rank()} step={step} groups={groups} loss={loss.item()!r} "
              f"grad_norm={float(norm)!r}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    from tests._exit import exit_now  # the repository is on PYTHONPATH (test_gloo.py sets it)

    main(sys.argv[1])
    exit_now()
