"""One torchrun worker: torchtitan 0.3's llama3 at a tiny size, a few steps, with its meshes or ours.

Run by test_llama3_gloo.py as
``torchrun --nproc_per_node=8 _worker.py --meshes {torchtitan,fm} --spmd-backend ... --out DIR``.
Rank 0 writes ``DIR/result.json``: every rank's losses and gradient norms per step (as
``float.hex``, compared exactly by the test) and every rank's process-group creations.

The step is torchtitan 0.3.0's ``Trainer.train_step`` for one microbatch without pipeline
parallelism, made of torchtitan's own pieces: ``parallelize_llama``, ``set_determinism``,
``CrossEntropyLoss``, ``default_adamw``, ``dist_utils.dist_sum_tensor`` /
``clip_grad_norm_`` / ``dist_sum``, ``full_dtensor.parallelize_inputs``, ``get_spmd_context``.
The Trainer itself is not built: it needs a tokenizer and a dataset from the network.

The model (llama3 at dim 64, 2 layers, vocab 256), the batches, the constants and the CPU
workarounds are examples/torchtitan_llama3.py's, loaded from it, so the example is what is
tested. CPU workarounds live in the example and in this harness, never in the library, each
marked ``CPU WORKAROUND``: torchtitan assumes an accelerator (its ``device_type`` is "cuda" on a
CPU-only machine), compiles FlexAttention with inductor, and trains in bfloat16 mixed precision.

Only the standard library and torch are imported at module level: pytest imports this file for
doctests in environments without torchtitan.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import pathlib
import sys
import time
from typing import Any

# -- counting process groups -------------------------------------------------------------------


class GroupCounter:
    """Wraps torch's group constructors everywhere they are called from; records every creation.

    torch's DeviceMesh calls the ``new_group``/``split_group`` it imported into its own module,
    functional_mesh calls ``torch.distributed.new_group``: all three names are wrapped.
    """

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.phase = "init"

    def install(self) -> None:
        import torch.distributed as dist
        from torch.distributed import device_mesh
        from torch.distributed import distributed_c10d as c10d

        def wrap(kind: str, fn: Any) -> Any:
            def counted(*args: Any, **kwargs: Any) -> Any:
                ranks = kwargs.get("ranks", args[0] if args else None)
                if kind == "split_group":
                    ranks = kwargs.get("split_ranks")
                self.calls.append({
                    "kind": kind, "phase": self.phase,
                    "ranks": None if ranks is None else [list(map(int, r)) for r in ranks]
                    if kind == "split_group" else list(map(int, ranks)),
                    "backend": str(kwargs.get("backend")),
                    "local": bool(kwargs.get("use_local_synchronization", False)),
                    "desc": kwargs.get("group_desc"),
                })
                return fn(*args, **kwargs)

            counted.__wrapped__ = fn
            return counted

        for kind in ("new_group", "split_group"):
            original = getattr(c10d, kind)
            wrapped = wrap(kind, original)
            for module in (c10d, dist, device_mesh):
                if getattr(module, kind, None) is original:
                    setattr(module, kind, wrapped)


# -- the model, the data and the CPU workarounds: the example's ----------------------------------------


def example() -> Any:
    """examples/torchtitan_llama3.py as a module: its tiny llama3, batches, constants and CPU workarounds
    (each marked ``CPU WORKAROUND`` there) are what this harness trains, so the two cannot drift."""
    import importlib.util

    name = "torchtitan_llama3_example"
    if name not in sys.modules:
        path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "torchtitan_llama3.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # torch.compile and pickling look modules up by name
        spec.loader.exec_module(module)
    return sys.modules[name]


def run(args: argparse.Namespace, counter: GroupCounter) -> dict[str, Any]:
    import spmd_types as spmd
    import torch
    import torch.distributed as dist
    from torchtitan.components.loss import IGNORE_INDEX, CrossEntropyLoss
    from torchtitan.components.optimizer import default_adamw
    from torchtitan.config import (
        CompileConfig,
        DebugConfig,
        ParallelismConfig,
        TrainingConfig,
    )
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.models.llama3 import parallelize_llama

    world = dist.get_world_size()
    degrees = {"dp_replicate": args.dp_replicate, "dp_shard": args.dp_shard, "cp": args.cp, "tp": args.tp, "pp": 1,
               "ep": 1}
    parallelism = ParallelismConfig(
        data_parallel_replicate_degree=args.dp_replicate, data_parallel_shard_degree=args.dp_shard,
        context_parallel_degree=args.cp, tensor_parallel_degree=args.tp, spmd_backend=args.spmd_backend)
    ex = example()  # the tiny model, batches and constants
    # CPU WORKAROUND: float32 parameters and reductions (FSDP's default bfloat16 params are slow on
    # CPU and would blur an exact comparison no more than float32 does; the comparison is exact either way).
    training = TrainingConfig(local_batch_size=ex.LOCAL_BATCH, seq_len=args.seq, steps=args.steps, max_norm=1.0,
                              mixed_precision_param="float32", mixed_precision_reduce="float32")
    dist_utils.set_spmd_backend(args.spmd_backend)

    timings = {}
    t0 = time.perf_counter()
    counter.phase = "build_mesh"
    if args.meshes == "fm":
        from functional_mesh.integrations import torchtitan as fm_titan

        pd = fm_titan.parallel_dims(world_size=world, spmd_backend=args.spmd_backend, **degrees)
    else:
        pd = ParallelDims(world_size=world, spmd_backend=args.spmd_backend, **degrees)
    pd.build_mesh()
    timings["build_mesh_s"] = time.perf_counter() - t0
    counter.phase = "run"

    device = torch.device("cpu")
    dist_utils.set_determinism(pd, device, DebugConfig(seed=ex.SEED), distinct_seed_mesh_dims=["pp"])
    model_config = ex.tiny_llama3(parallelism, args.seq)
    with torch.device("meta"):
        model = model_config.build()
    model = parallelize_llama(model, parallel_dims=pd, training=training, parallelism=parallelism,
                              compile_config=CompileConfig(), ac_config=None, dump_folder="")
    # CPU WORKAROUND: torchtitan sets FSDP's gradient divide factor to 1 (it scales by the global
    # token count itself), which FSDP2 turns into a ReduceOp.PREMUL_SUM(1/1) reduce-scatter: gloo has
    # no PREMUL_SUM. Forcing SUM reductions multiplies by the same factor 1 after the sum instead.
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    optimizers = default_adamw(lr=ex.LR).build(model_parts=[model])
    loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config(global_vocab_size=ex.VOCAB))
    train_context = dist_utils.get_spmd_context(parallel_dims=pd)

    if pd.dp_enabled:
        batch_mesh = pd.get_mesh("batch")
        batch_degree, batch_rank = batch_mesh.size(), batch_mesh.get_local_rank()
    else:
        batch_degree, batch_rank = 1, 0

    steps = []
    t1 = time.perf_counter()
    for inputs, labels in ex.batches(args.steps, args.seq, batch_degree, batch_rank):
        # torchtitan 0.3.0 Trainer.train_step, one microbatch, no PP
        optimizers.zero_grad(set_to_none=training.disable_cuda_graphs)
        local_valid_tokens = (labels != IGNORE_INDEX).sum()
        global_valid_tokens = (dist_utils.dist_sum_tensor(local_valid_tokens, pd.get_mesh("batch"))
                               if pd.dp_enabled else local_valid_tokens)
        # Trainer.post_dataloading_process
        inputs, labels, extra = ex.model_inputs(pd, parallelism, model, inputs, labels, device)
        # Trainer._forward_backward_body
        with train_context():
            pred = model(inputs, **extra)
            loss, _ = loss_fn(pred, labels, global_valid_tokens)
            del pred
            with spmd.no_typecheck():  # as the Trainer: forward typechecking only
                loss.backward()
        grad_norm = dist_utils.clip_grad_norm_([p for p in model.parameters()], training.max_norm, foreach=True,
                                               pp_mesh=pd.get_optional_mesh("pp"), ep_enabled=pd.ep_enabled)
        optimizers.step()
        loss = loss.detach()
        global_loss = dist_utils.dist_sum(loss, pd.get_optional_mesh("loss")) if pd.dp_cp_enabled else loss.item()
        local = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        steps.append({"loss": float(global_loss).hex(), "local_loss": float(local).hex(),
                      "grad_norm": float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor")
                                         else grad_norm).hex()})
    timings["steps_s"] = time.perf_counter() - t1
    counter.phase = "done"
    return {"steps": steps, "groups": counter.calls, "timings": timings}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshes", choices=["torchtitan", "fm"], required=True)
    parser.add_argument("--spmd-backend", default="partial_dtensor")
    parser.add_argument("--dp-replicate", type=int, default=2)
    parser.add_argument("--dp-shard", type=int, default=2)
    parser.add_argument("--cp", type=int, default=1)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    # 32; context parallelism over flex attention needs a multiple of 2 * cp * 128 (its block size)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=120.0, help="timeout of every process group (s)")
    parser.add_argument("--deadline", type=float, default=600.0, help="the whole worker's wall time (s)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    # A hang shows where every rank was, then ends the worker (torchrun then ends the others).
    faulthandler.dump_traceback_later(args.deadline, exit=True)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    counter = GroupCounter()
    counter.install()  # before any group exists; the default group is not counted
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    example().cpu_workarounds()
    rank = dist.get_rank()
    result = run(args, counter)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, result)
    if rank == 0:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps({"args": vars(args), "ranks": everyone}, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # functional_mesh from the work tree
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
