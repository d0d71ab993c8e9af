"""One torchrun worker: a torchtitan 0.3 model at a tiny size, a few steps, with its meshes or ours.

Run by test_train_gloo.py as
``torchrun --nproc_per_node=8 _worker.py --meshes {torchtitan,fm} --model {llama3,deepseek_v3}
--spmd-backend ... [--pp 2 --ep 2 ...] --out DIR``.
Rank 0 writes ``DIR/result.json``: every rank's losses and gradient norms per step (as
``float.hex``, compared exactly by the test), every rank's process-group creations, and with
expert parallelism every routed-token all-to-all (its group and splits).

The step is torchtitan 0.3.0's ``Trainer.train_step`` made of torchtitan's own pieces:
``parallelize_llama`` / ``parallelize_deepseekv3``, ``pipeline_llm`` and its schedule with PP,
``set_determinism``, ``CrossEntropyLoss``, ``default_adamw`` (and deepseek_v3's
``register_moe_load_balancing_hook``), ``dist_utils.dist_sum_tensor`` / ``clip_grad_norm_`` /
``dist_sum``, ``full_dtensor.parallelize_inputs``, ``get_spmd_context``. The Trainer itself is
not built: it needs a tokenizer and a dataset from the network.

The llama3 model (dim 64, 2 layers, vocab 256), the batches, the constants and the CPU
workarounds are examples/torchtitan_llama3.py's, loaded from it, so the example is what is
tested; deepseek_v3 is its debugmodel at CPU widths (:func:`tiny_deepseek_v3`). CPU workarounds
live in the example and in this harness, never in the library, each marked ``CPU WORKAROUND``:
torchtitan assumes an accelerator (its ``device_type`` is "cuda" on a CPU-only machine),
compiles FlexAttention and its block masks with torch.compile, and trains in bfloat16 mixed
precision. One is for torch 2.13 (``TORCH 2.13 WORKAROUND``): torchtitan's PP step calls
torch 2.14's ``schedule.step(arg_mbs=...)``.

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


def tiny_deepseek_v3(parallelism: Any, training: Any) -> Any:
    """torchtitan's deepseek_v3 "debugmodel", smaller: the same structure and routing, CPU-sized widths.

    Kept from the debugmodel: 8 routed experts and 2 shared ones, top-3 softmax routing, the first
    layer dense and the rest MoE, MLA attention without a q projection rank (q_lora_rank 0), its
    yarn RoPE and mscale, its inits (``_build_dsv3_layers``), flex attention, the "standard" token
    dispatcher (all-to-all over "ep"). Changed, to train in seconds on 2 shared cores: 3 layers (not 6),
    dim 64 (256), vocab 256 (2048), 4 heads (16), kv_lora_rank 32 (512), qk_nope/qk_rope/v head dims
    16/16/16 (128/64/128), expert hidden 64 (256), dense hidden 128 (1024). Every width stays a
    multiple of 8, as ``torch._grouped_mm`` needs 16-byte strides in bfloat16.
    """
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.deepseek_v3 import (
        _EMBEDDING_INIT,
        _NORM_INIT,
        DeepSeekV3Model,
        _build_dsv3_layers,
        _build_mtp_layers,
        _output_linear_init,
    )

    dim, vocab, rope_dim = 64, example().VOCAB, 16
    layers = _build_dsv3_layers(
        n_layers=3, n_dense_layers=1, dim=dim, n_heads=4, q_lora_rank=0, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=rope_dim, v_head_dim=16, mscale=0.70,
        dense_hidden_dim=128, moe_hidden_dim=64, num_experts=8, num_shared_experts=2, router_top_k=3,
        router_score_func="softmax", attn_backend="flex", moe_comm_backend="standard",
        non_blocking_capacity_factor=None,
        rope=ComplexRoPE.Config(dim=rope_dim, max_seq_len=4096 * 4, theta=10000.0, scaling="yarn", rope_factor=40.0,
                                beta_fast=32.0, beta_slow=1.0, original_seq_len=4096))
    config = DeepSeekV3Model.Config(
        vocab_size=vocab, dim=dim,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_output_linear_init(dim)),
        layers=layers, mtp_layers=_build_mtp_layers(layers[-1], dim=dim, num_mtp_layers=0))

    class _Runtime:  # update_from_config takes any config with .parallelism (and .training for EP dispatchers)
        pass

    holder = _Runtime()
    holder.parallelism, holder.training = parallelism, training
    config.update_from_config(config=holder)
    return config


def record_token_exchanges(pd: Any) -> list[dict[str, Any]]:
    """Record every routed-token all-to-all of torchtitan's EP dispatcher (``AllToAllTokenDispatcher``).

    Each record: the members of the group it ran over, its input and output splits, and whether that
    group is the "ep" group of our realized sparse view (``None`` on torchtitan's meshes).
    """
    import torch.distributed as dist
    from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher

    records: list[dict[str, Any]] = []
    exchange = AllToAllTokenDispatcher._dispatch_token_exchange

    def recorded(self: Any, routed_input: Any, pg: Any, output_splits: list[int], input_splits: list[int]) -> Any:
        group = self.ep_mesh.get_group()
        ours = pd.realized["sparse"].group("ep") if hasattr(pd, "realized") else None
        records.append({"ranks": dist.get_process_group_ranks(group), "input_splits": list(input_splits),
                        "output_splits": list(output_splits), "ours": None if ours is None else group is ours})
        return exchange(self, routed_input, pg, output_splits, input_splits)

    AllToAllTokenDispatcher._dispatch_token_exchange = recorded
    return records


def record_stage_meshes(records: list[dict[str, Any]]) -> None:
    """Record what pipeline stages ask ``ParallelDims`` for when they rebuild a received DTensor's mesh.

    torchtitan's ``pipeline_llm`` hands each ``PipelineStage`` a callback (``_build_get_mesh_callback``)
    that looks the mesh up by dim names and returns it only if its layout is the sender's (else None,
    and the stage cannot rebuild the DTensor). Each record: the dim names, and whether a mesh came back.
    """
    import torchtitan.distributed.pipeline_parallel as titan_pp

    build = titan_pp._build_get_mesh_callback

    def recording(parallel_dims: Any) -> Any:
        get_mesh = build(parallel_dims)

        def recorded(names: tuple[str, ...], layout: Any) -> Any:
            mesh = get_mesh(names, layout)
            records.append({"names": list(names), "found": mesh is not None})
            return mesh

        return recorded

    titan_pp._build_get_mesh_callback = recording


def pp_step(schedule: Any, *, arg_mbs: Any, kwarg_mbs: Any, target_mbs: Any, losses: Any, loss_kwargs: Any) -> None:
    """``schedule.step`` with microbatches already split, as torchtitan 0.3.0's Trainer calls it.

    TORCH 2.13 WORKAROUND: ``step(arg_mbs=, kwarg_mbs=, target_mbs=)`` is torch 2.14's signature;
    torch 2.13's ``step`` takes whole batches (it would hand those names to the model as inputs).
    There, the same three steps 2.14's ``step`` takes for pre-split microbatches: flag the stages for
    backward, clear their state, run ``_step_microbatches``.
    """
    import inspect

    if "arg_mbs" in inspect.signature(schedule.step).parameters:
        schedule.step(arg_mbs=arg_mbs, kwarg_mbs=kwarg_mbs, target_mbs=target_mbs, losses=losses,
                      loss_kwargs=loss_kwargs, return_outputs=False)
        return
    stages = getattr(schedule, "_stages", None) or [schedule._stage]
    for stage in stages:
        stage.has_backward = schedule._has_backward
        stage.clear_runtime_states()
    schedule._step_microbatches(arg_mbs, kwarg_mbs, target_mbs, losses, False, loss_kwargs=loss_kwargs)


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

    world = dist.get_world_size()
    degrees = {"dp_replicate": args.dp_replicate, "dp_shard": args.dp_shard, "cp": args.cp, "tp": args.tp,
               "pp": args.pp, "ep": args.ep}
    parallelism = ParallelismConfig(
        data_parallel_replicate_degree=args.dp_replicate, data_parallel_shard_degree=args.dp_shard,
        context_parallel_degree=args.cp, tensor_parallel_degree=args.tp, pipeline_parallel_degree=args.pp,
        pipeline_parallel_schedule=args.pp_schedule, pipeline_parallel_microbatch_size=1,
        expert_parallel_degree=args.ep, spmd_backend=args.spmd_backend)
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
    if args.model == "deepseek_v3":
        from torchtitan.models.deepseek_v3 import parallelize_deepseekv3 as parallelize_fn

        model_config = tiny_deepseek_v3(parallelism, training)
    else:
        from torchtitan.models.llama3 import parallelize_llama as parallelize_fn

        model_config = ex.tiny_llama3(parallelism, args.seq)
    with torch.device("meta"):
        model = model_config.build()
    loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config(global_vocab_size=ex.VOCAB))
    parallelize_args = {"parallel_dims": pd, "training": training, "parallelism": parallelism,
                        "compile_config": CompileConfig(), "ac_config": None, "dump_folder": ""}
    stage_meshes: list[dict[str, Any]] = []
    if pd.pp_enabled:  # torchtitan's Trainer.__init__ with PP: its pipeline_llm splits, then parallelizes each part
        from torchtitan.distributed.pipeline_parallel import pipeline_llm

        record_stage_meshes(stage_meshes)
        pp_schedule, model_parts, first_stage, last_stage = pipeline_llm(
            model, **parallelize_args, device=device, model_config=model_config, parallelize_fn=parallelize_fn,
            loss_fn=loss_fn)
        del model
    else:
        model_parts, first_stage, last_stage = [parallelize_fn(model, **parallelize_args)], True, True
    # CPU WORKAROUND: torchtitan sets FSDP's gradient divide factor to 1 (it scales by the global
    # token count itself), which FSDP2 turns into a ReduceOp.PREMUL_SUM(1/1) reduce-scatter: gloo has
    # no PREMUL_SUM. Forcing SUM reductions multiplies by the same factor 1 after the sum instead.
    from torch.distributed.fsdp import FSDPModule

    for part in model_parts:
        for module in part.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
        part.to_empty(device=device)
        with torch.no_grad():
            part.init_weights(buffer_device=None)
        part.train()
    optimizers = default_adamw(lr=ex.LR).build(model_parts=model_parts)
    if args.model == "deepseek_v3":  # its ModelSpec's post_optimizer_build_fn: expert-bias load balancing
        from torchtitan.components.optimizer import register_moe_load_balancing_hook

        register_moe_load_balancing_hook(optimizers, model_parts, pd)
    train_context = dist_utils.get_spmd_context(parallel_dims=pd)
    exchanges = record_token_exchanges(pd) if pd.ep_enabled else []

    if pd.dp_enabled:
        batch_mesh = pd.get_mesh("batch")
        batch_degree, batch_rank = batch_mesh.size(), batch_mesh.get_local_rank()
    else:
        batch_degree, batch_rank = 1, 0

    def forward_backward(inputs: Any, labels: Any, global_valid_tokens: Any) -> Any:
        """Trainer.forward_backward_step: post_dataloading_process, then one microbatch or the PP schedule."""
        if not pd.pp_enabled:
            inputs, labels, extra = ex.model_inputs(pd, parallelism, model_parts[0], inputs, labels, device)
            with train_context():  # Trainer._forward_backward_body
                pred = model_parts[0](inputs, **extra)
                loss, _ = loss_fn(pred, labels, global_valid_tokens)
                del pred
                with spmd.no_typecheck():  # as the Trainer: forward typechecking only
                    loss.backward()
            return loss
        # Trainer.pp_forward_backward_step; its dataloader yields microbatch-size rows, one per microbatch
        arg_mbs, kwarg_mbs, target_mbs = [], [], []
        for row in range(inputs.shape[0]):
            mb_inputs, mb_labels, extra = ex.model_inputs(pd, parallelism, model_parts[0], inputs[row:row + 1],
                                                          labels[row:row + 1], device)
            arg_mbs.append((mb_inputs,))
            kwarg_mbs.append(extra)
            target_mbs.append(mb_labels)
        losses = [] if last_stage else None
        with train_context():
            pp_step(pp_schedule, arg_mbs=arg_mbs if first_stage else None, kwarg_mbs=kwarg_mbs,
                    target_mbs=target_mbs if last_stage else None, losses=losses,
                    loss_kwargs={"global_valid_tokens": global_valid_tokens})
        return torch.sum(torch.stack(losses)).to(device) if last_stage else torch.tensor([-1.0], device=device)

    steps, step_s = [], []
    t1 = time.perf_counter()
    for inputs, labels in ex.batches(args.steps, args.seq, batch_degree, batch_rank):
        # torchtitan 0.3.0 Trainer.train_step, one gradient-accumulation step
        optimizers.zero_grad(set_to_none=training.disable_cuda_graphs)
        local_valid_tokens = (labels != IGNORE_INDEX).sum()
        global_valid_tokens = (dist_utils.dist_sum_tensor(local_valid_tokens, pd.get_mesh("batch"))
                               if pd.dp_enabled else local_valid_tokens)
        loss = forward_backward(inputs, labels, global_valid_tokens)
        grad_norm = dist_utils.clip_grad_norm_([p for m in model_parts for p in m.parameters()], training.max_norm,
                                               foreach=True, pp_mesh=pd.get_optional_mesh("pp"),
                                               ep_enabled=pd.ep_enabled)
        optimizers.step()
        loss = loss.detach()
        global_loss = dist_utils.dist_sum(loss, pd.get_optional_mesh("loss")) if pd.dp_cp_enabled else loss.item()
        local = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        steps.append({"loss": float(global_loss).hex(), "local_loss": float(local.sum()).hex(),
                      "grad_norm": float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor")
                                         else grad_norm).hex()})
        step_s.append(round(time.perf_counter() - t1 - sum(step_s), 2))
    timings["steps_s"], timings["step_s"] = time.perf_counter() - t1, step_s
    counter.phase = "done"
    return {"steps": steps, "groups": counter.calls, "timings": timings, "token_exchanges": exchanges,
            "stage_meshes": stage_meshes}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshes", choices=["torchtitan", "fm"], required=True)
    parser.add_argument("--spmd-backend", default="partial_dtensor")
    parser.add_argument("--dp-replicate", type=int, default=2)
    parser.add_argument("--dp-shard", type=int, default=2)
    parser.add_argument("--cp", type=int, default=1)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("--pp-schedule", default="1F1B", help="torchtitan's pipeline_parallel_schedule")
    parser.add_argument("--model", choices=["llama3", "deepseek_v3"], default="llama3")
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
    from tests._exit import exit_now

    main()
    exit_now()
