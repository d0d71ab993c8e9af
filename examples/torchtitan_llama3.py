"""torchtitan's llama3, trained a few steps on torchtitan's meshes built from one functional_mesh mesh.

Run (8 workers: gloo on CPU, NCCL when every worker has a GPU), in a venv with torchtitan 0.3.0:

    make .venv-titan/.installed      # once: torch 2.13.0 + torchtitan 0.3.0 (make test-torchtitan too)
    OMP_NUM_THREADS=1 .venv-titan/bin/torchrun --standalone --nproc_per_node=8 examples/torchtitan_llama3.py

Options: ``--dp-replicate 2 --dp-shard 2 --cp 1 --tp 2`` (the default; their product is the world
size), ``--spmd-backend partial_dtensor`` (or ``full_dtensor``; torchtitan's default,
``spmd_types``, needs torch >= 2.14: ``make test-torchtitan TORCH=2.14.1`` builds
``.venv-titan-2.14.1``), ``--steps 4``, ``--meshes torchtitan`` for the same run on torchtitan's
own meshes (the same losses: tests/torchtitan compares them bit for bit).

1. The plan, pure: ``fm_titan.mesh_family`` says which functional_mesh value stands for each of
   torchtitan's meshes ("dataloading", "loss", "dense", "sparse"), all derived from one world
   mesh, and which axes of each get a process group (the ones torchtitan talks over).
2. ``fm_titan.parallel_dims``: torchtitan's own ``ParallelDims`` class, whose ``build_mesh``
   realizes those values; every distinct rank set gets one process group.
3. torchtitan's llama3 at a tiny size (dim 64, 2 layers, vocab 256), made with its own
   ``parallelize_llama`` (tensor parallel + FSDP2 HSDP), loss, AdamW and gradient clipping:
   the body of its ``Trainer.train_step`` on fixed token batches (the Trainer itself wants a
   tokenizer and a data set from the network). Rank 0 prints the global loss of every step.
4. Groups per rank: ``fm.cache_info().groups``, after build_mesh and after training (the same:
   training made none through functional_mesh), and this rank's group on every axis of every view.

CPU workarounds (torchtitan assumes an accelerator) are in ``cpu_workarounds`` and the two spots
marked ``CPU WORKAROUND``, applied only when the workers have no GPU; none is in the library. The
GPU path (NCCL, bfloat16, compiled FlexAttention) is torchtitan's own and was not run here.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

import torch
import torch.distributed as dist

import functional_mesh as fm

try:  # one clear line per worker, instead of 8 long tracebacks, where torchtitan is missing
    from torchtitan.models.llama3 import parallelize_llama  # first, so that its absence is what is reported
    import spmd_types  # torchtitan's dependency, installed with it

    from functional_mesh.integrations import torchtitan as fm_titan

    fm_titan.check_version()
except Exception as exc:  # noqa: BLE001 - ImportError, or whatever a missing dependency of torchtitan raises
    raise SystemExit(f"torchtitan_llama3.py needs torchtitan 0.3.0, which {sys.executable} cannot use "
                     f"({type(exc).__name__}: {exc}). Build its venv with `make .venv-titan/.installed` and run "
                     f"`.venv-titan/bin/torchrun --standalone --nproc_per_node=8 examples/torchtitan_llama3.py`"
                     ) from None

VOCAB, DIM, HEADS, LAYERS = 256, 64, 4, 2
LOCAL_BATCH, SEED, LR = 2, 42, 8e-4


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp-replicate", type=int, default=2)
    parser.add_argument("--dp-shard", type=int, default=2)
    parser.add_argument("--cp", type=int, default=1)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--spmd-backend", default="partial_dtensor", choices=fm_titan.SPMD_BACKENDS)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seq", type=int, default=None,
                        help="sequence length (default 32; 128 * cp with context parallelism, flex attention's block)")
    parser.add_argument("--meshes", choices=["fm", "torchtitan"], default="fm",
                        help="whose meshes: functional_mesh's (default) or torchtitan's own ParallelDims")
    args = parser.parse_args()
    if args.seq is None:
        args.seq = 32 if args.cp == 1 else 128 * args.cp
    return args


# -- CPU workarounds (this example only; the library has none) --------------------------------


def cpu_workarounds() -> None:
    """Make torchtitan 0.3.0 run on CPU workers with gloo."""
    import torchtitan.distributed.parallel_dims as titan_parallel_dims
    import torchtitan.models.common.attention as titan_attention
    import torchtitan.tools.utils as titan_utils
    from torchtitan.models.common.attention import FlexAttention

    # CPU WORKAROUND: torchtitan's device_type is "cuda" on a machine without an accelerator, and
    # its own ParallelDims.build_mesh hands it to init_device_mesh (--meshes torchtitan). Ours does
    # not read it: functional_mesh follows the default group (gloo -> cpu, NCCL -> cuda).
    titan_utils.device_type, titan_utils.device_module = "cpu", torch.cpu
    titan_parallel_dims.device_type = "cpu"
    # CPU WORKAROUND: FlexAttention runs torch.compile(flex_attention), which has no backward on
    # CPU in torch 2.13: the same masked attention through scaled_dot_product_attention.
    FlexAttention._compiled_flex_attn = _flex_attention_as_sdpa
    # CPU WORKAROUND (time only): torchtitan builds its block masks with torch.compile(create_block_mask),
    # ~16 s of tracing per process on first use (more with 8 processes on 2 cores) for a tiny mask.
    # The eager create_block_mask builds the same BlockMask: the losses do not change.
    from torch.nn.attention.flex_attention import create_block_mask

    titan_attention._compiled_create_block_mask = create_block_mask
    # Not a workaround, quiet: DTensor notes once per rank that its random ops are meant for GPUs.
    warnings.filterwarnings("ignore", message=r"DTensor .* may not have complete support on cpu device mesh")


def _flex_attention_as_sdpa(q, k, v, *, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                            return_aux=None, kernel_options=None):
    """flex_attention's result for a mask-only BlockMask, through SDPA (which has a CPU backward)."""
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import AuxOutput, create_mask

    if score_mod is not None or (return_aux is not None and (return_aux.lse or return_aux.max_scores)):
        raise NotImplementedError("the CPU stand-in for flex_attention takes a mask only and returns no aux")
    mask = None
    if block_mask is not None:
        mask = create_mask(block_mask.mask_mod, q.shape[0], None, q.shape[-2], k.shape[-2], device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa), AuxOutput()


# -- the model and the data -----------------------------------------------------------------------


def tiny_llama3(parallelism, seq: int):
    """torchtitan's llama3 (its "debugmodel" recipe) at dim 64, 2 layers, 4 heads, vocab 256."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm, compute_ffn_hidden_dim
    from torchtitan.models.llama3 import (
        _EMBEDDING_INIT,
        _NORM_INIT,
        Llama3Model,
        _build_llama3_layers,
        _output_linear_init,
    )

    config = Llama3Model.Config(
        dim=DIM, vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=DIM, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=_output_linear_init(DIM)),
        layers=_build_llama3_layers(
            fuse_qkv=True, n_layers=LAYERS, dim=DIM, n_heads=HEADS,
            hidden_dim=compute_ffn_hidden_dim(DIM, multiple_of=64),
            rope=ComplexRoPE.Config(dim=DIM // HEADS, max_seq_len=seq, theta=500000, scaling="llama"),
            attn_backend="flex"),
    )

    class _Parallelism:  # update_from_config takes any config with a .parallelism (here: TP divides heads)
        pass

    holder = _Parallelism()
    holder.parallelism = parallelism
    config.update_from_config(config=holder)
    return config


def batches(steps: int, seq: int, batch_degree: int, batch_rank: int):
    """One fixed global batch of random tokens per step; this data-parallel rank's rows of it."""
    g = torch.Generator().manual_seed(SEED)
    for _ in range(steps):
        tokens = torch.randint(0, VOCAB, (LOCAL_BATCH * batch_degree, seq + 1), generator=g)
        mine = tokens[batch_rank * LOCAL_BATCH:(batch_rank + 1) * LOCAL_BATCH]
        yield mine[:, :-1].contiguous(), mine[:, 1:].contiguous()


# -- groups per rank ------------------------------------------------------------------------------


def model_inputs(pd, parallelism, model, inputs, labels, device):
    """torchtitan's Trainer.post_dataloading_process for one batch: positions and attention masks,
    the sequence sharded over cp, the inputs typed for the spmd_backend. ``(inputs, labels, extra)``."""
    from torchtitan.distributed import full_dtensor
    from torchtitan.distributed.context_parallel import prepare_context_parallel_input

    seq = inputs.shape[1]
    positions = torch.arange(seq, device=device).expand(inputs.shape[0], seq)
    extra = {"positions": positions, "attention_masks": model.get_attention_masks(positions=positions)}
    if pd.cp_enabled:  # shard the sequence (and the masks) over cp
        inputs, labels, extra = prepare_context_parallel_input(
            inputs, labels, extra, pd.get_mesh("cp"), device, parallelism.context_parallel_load_balancer,
            parallelism.context_parallel_ptrr_mask_key)
    if parallelism.spmd_backend == "full_dtensor":
        inputs, labels, extra = full_dtensor.parallelize_inputs(pd, inputs, labels, extra)
    elif parallelism.spmd_backend == "spmd_types":
        from torchtitan.distributed.spmd_types import annotate_input_spmd_types

        inputs, labels, extra = annotate_input_spmd_types(pd, inputs, labels, extra)
    return inputs, labels, extra


def group_lines(pd, family) -> list[str]:
    """This rank's group on every axis that has one, view by view."""
    lines = [f"{'view':<12} {'mesh value':<52} this rank's group per axis"]
    for name, view in family.views.items():
        rm = pd.realized[name]
        mine = "  ".join(f"{axis} {dist.get_process_group_ranks(rm.group(axis))}" for axis in view.real)
        lines.append(f"{name:<12} {view.mesh!r:<52} {mine or '(none: every axis of size 1)'}")
    return lines


# -- the run --------------------------------------------------------------------------------------


def main() -> None:
    args = parse_args()
    # Quiet: under partial_dtensor, DTensor warns on every rank that torchtitan's gradient norm is
    # reduced over (fsdp, tp) by two all-reduces; the same with torchtitan's own meshes.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    world = int(os.environ["WORLD_SIZE"])  # set by torchrun
    degrees = {"dp_replicate": args.dp_replicate, "dp_shard": args.dp_shard, "cp": args.cp, "tp": args.tp,
               "pp": 1, "ep": 1}

    # 1. The plan: pure values, no torch.distributed (any rank could print it, or a laptop).
    family = fm_titan.mesh_family(world_size=world, spmd_backend=args.spmd_backend, **degrees)

    gpus = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])
    if gpus:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
        cpu_workarounds()
    dist.init_process_group("nccl" if gpus else "gloo")
    rank = dist.get_rank()
    if rank == 0:
        print(f"world {world} unflattened into {family.base!r}; spmd_backend {args.spmd_backend}, "
              f"{device.type} ({dist.get_backend()})")

    from torchtitan.components.loss import IGNORE_INDEX, CrossEntropyLoss
    from torchtitan.components.optimizer import default_adamw
    from torchtitan.config import CompileConfig, DebugConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.distributed.parallel_dims import ParallelDims

    parallelism = ParallelismConfig(
        data_parallel_replicate_degree=args.dp_replicate, data_parallel_shard_degree=args.dp_shard,
        context_parallel_degree=args.cp, tensor_parallel_degree=args.tp, spmd_backend=args.spmd_backend)
    # CPU WORKAROUND: float32 parameters and reductions (FSDP's bfloat16 default is slow on CPU).
    precision = {} if gpus else {"mixed_precision_param": "float32", "mixed_precision_reduce": "float32"}
    training = TrainingConfig(local_batch_size=LOCAL_BATCH, seq_len=args.seq, steps=args.steps, max_norm=1.0,
                              **precision)
    dist_utils.set_spmd_backend(args.spmd_backend)

    # 2. torchtitan's ParallelDims; ours realizes the family's values (build_mesh, on every rank).
    if args.meshes == "fm":
        pd = fm_titan.parallel_dims(world_size=world, spmd_backend=args.spmd_backend, **degrees)
    else:
        pd = ParallelDims(world_size=world, spmd_backend=args.spmd_backend, **degrees)
    pd.build_mesh()
    groups_after_build = fm.cache_info().groups

    # 3. The model, parallelized by torchtitan, and Trainer.train_step's body (one microbatch, no PP).
    dist_utils.set_determinism(pd, device, DebugConfig(seed=SEED), distinct_seed_mesh_dims=["pp"])
    with torch.device("meta"):
        model = tiny_llama3(parallelism, args.seq).build()
    model = parallelize_llama(model, parallel_dims=pd, training=training, parallelism=parallelism,
                              compile_config=CompileConfig(), ac_config=None, dump_folder="")
    if not gpus:
        # CPU WORKAROUND: torchtitan gives FSDP a gradient divide factor of 1 (it divides by the global
        # token count itself), which FSDP2 sends as a ReduceOp.PREMUL_SUM reduce-scatter: gloo has no
        # PREMUL_SUM. SUM reductions apply the same factor 1 after the sum.
        from torch.distributed.fsdp import FSDPModule

        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    optimizers = default_adamw(lr=LR).build(model_parts=[model])
    loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config(global_vocab_size=VOCAB))
    train_context = dist_utils.get_spmd_context(parallel_dims=pd)
    batch_mesh = pd.get_mesh("batch") if pd.dp_enabled else None
    batch_degree, batch_rank = (batch_mesh.size(), batch_mesh.get_local_rank()) if batch_mesh else (1, 0)

    for step, (inputs, labels) in enumerate(batches(args.steps, args.seq, batch_degree, batch_rank), start=1):
        inputs, labels = inputs.to(device), labels.to(device)
        optimizers.zero_grad(set_to_none=training.disable_cuda_graphs)
        local_tokens = (labels != IGNORE_INDEX).sum()
        global_tokens = dist_utils.dist_sum_tensor(local_tokens, batch_mesh) if batch_mesh else local_tokens
        inputs, labels, extra = model_inputs(pd, parallelism, model, inputs, labels, device)
        with train_context():
            loss, _ = loss_fn(model(inputs, **extra), labels, global_tokens)
            with spmd_types.no_typecheck():  # as torchtitan's Trainer: typechecking in the forward only
                loss.backward()
        grad_norm = dist_utils.clip_grad_norm_(list(model.parameters()), training.max_norm, foreach=True,
                                               pp_mesh=pd.get_optional_mesh("pp"), ep_enabled=pd.ep_enabled)
        optimizers.step()
        loss = loss.detach()
        global_loss = dist_utils.dist_sum(loss, pd.get_optional_mesh("loss")) if pd.dp_cp_enabled else loss.item()
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        if rank == 0:
            print(f"step {step}: loss {global_loss:.6f}  grad_norm {float(grad_norm):.6f}")

    # 4. Groups per rank: every rank made the same number, all of them in build_mesh.
    counts: list = [None] * world
    dist.all_gather_object(counts, (groups_after_build, fm.cache_info().groups))
    if args.meshes == "fm":
        assert len(set(counts)) == 1 and counts[0][0] == counts[0][1], counts
        if rank == 0:
            print("\n".join(group_lines(pd, family)))
            print(f"{counts[0][0]} process groups per rank: one per distinct rank set, all made by build_mesh "
                  f"(fm.cache_info(); none during training)")
    elif rank == 0:
        print("torchtitan's own meshes: its groups are not functional_mesh's to count (docs/torchtitan.md, "
              "'What it costs')")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
