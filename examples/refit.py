"""RL refit: a small transformer's state dict from a trainer's mesh to a generator's, in one ``fm.reshard`` call.

Run:  OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=8 examples/refit.py

The state dict: 3 layers of a Llama-style block (attention and feed-forward norms in float32; the
q, k, v, o and w1, w2, w3 matrices in bfloat16), the embeddings, the final norm and the output
layer: 30 tensors. The trainer holds it as FSDP2 + TP would: column-parallel weights
``P(("tp", "dp_shard"))`` (a ``_StridedShard``), row-parallel ones ``P("dp_shard", "tp")``, norms
``P("dp_shard")``. The generator wants tensor parallelism only: ``P("tp")``, ``P(None, "tp")``,
norms replicated; its dp replicas each get a full tp copy.

1. Disjoint: the trainer (dp_shard 2, tp 2) on ranks 0-3, the generator (dp 2, tp 2) on ranks 4-7,
   each realized members-only by its own ranks. Trainer ranks pass their DTensors, generator ranks
   ``fm.ShapeDtypeStruct``\\ s (they hold none of the source) and their realized mesh; every piece
   one rank sends another in a stage, of all 30 tensors, travels in one message.
2. Colocated: the same 8 ranks, trainer (dp_shard 4, tp 2) to generator (dp 2, tp 4).

Each generator rank checks every local block against the full tensor, bit for bit, and rank 0
prints the totals (tensors, bytes the plans move, stages: one exchange each). Runs on CPU (gloo); written for CUDA
(NCCL) too, but not run on a GPU here.
"""

from __future__ import annotations

import zlib
from typing import Any

import torch
import torch.distributed as dist

import functional_mesh as fm
from functional_mesh import NamedSharding, P

COLUMN = (P(("tp", "dp_shard")), P("tp"))  # (trainer spec, generator spec): output features split over tp
ROW = (P("dp_shard", "tp"), P(None, "tp"))  # input features split over tp
NORM = (P("dp_shard"), P())


def transformer_state(layers: int = 3, dim: int = 64, hidden: int = 160, vocab: int = 96) -> dict[str, Any]:
    """``name -> (shape, dtype, trainer spec, generator spec)`` of a small Llama-style model's state dict."""
    bf16, fp32 = torch.bfloat16, torch.float32
    state: dict[str, Any] = {"tok_embeddings.weight": ((vocab, dim), bf16, *COLUMN)}
    for i in range(layers):
        layer = f"layers.{i}."
        state[layer + "attention_norm.weight"] = ((dim,), fp32, *NORM)
        for name in ("wq", "wk", "wv"):
            state[layer + f"attention.{name}.weight"] = ((dim, dim), bf16, *COLUMN)
        state[layer + "attention.wo.weight"] = ((dim, dim), bf16, *ROW)
        state[layer + "ffn_norm.weight"] = ((dim,), fp32, *NORM)
        state[layer + "feed_forward.w1.weight"] = ((hidden, dim), bf16, *COLUMN)
        state[layer + "feed_forward.w3.weight"] = ((hidden, dim), bf16, *COLUMN)
        state[layer + "feed_forward.w2.weight"] = ((dim, hidden), bf16, *ROW)
    state["norm.weight"] = ((dim,), fp32, *NORM)
    state["output.weight"] = ((vocab, dim), bf16, *COLUMN)
    return state


def full_value(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The trained value of ``name`` (random bits seeded by the name): the same on every rank."""
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randn(shape, generator=gen).to(dtype)


def trainer_values(state: dict[str, Any], trainer: fm.Mesh, rm: Any) -> dict[str, Any]:
    """What this rank passes: its DTensors on a trainer rank, shapes and dtypes elsewhere."""
    out = {}
    for name, (shape, dtype, spec, _) in state.items():
        sharding = NamedSharding(trainer, spec)
        out[name] = (fm.distribute(full_value(name, shape, dtype), sharding, mesh=rm) if rm is not None
                     else fm.ShapeDtypeStruct(shape, dtype, sharding=sharding))
    return out


def generator_shardings(state: dict[str, Any], generator: fm.Mesh) -> dict[str, NamedSharding]:
    return {name: NamedSharding(generator, spec) for name, (_, _, _, spec) in state.items()}


def mismatches(state: dict[str, Any], got: dict[str, Any], generator: fm.Mesh, rm: Any) -> list[str]:
    """The tensors whose placements or local bits differ from the full value's block (a generator rank)."""
    rank, bad = dist.get_rank(), []
    for name, (shape, dtype, _, spec) in state.items():
        want = NamedSharding(generator, spec)
        out = got[name]
        if out.device_mesh is not rm.device_mesh or tuple(out.placements) != tuple(want.placements) or \
                not torch.equal(out.to_local(), full_value(name, shape, dtype)[want.local_slices(shape, rank)]):
            bad.append(name)
    return bad


def refit(state: dict[str, Any], trainer: fm.Mesh, generator: fm.Mesh, *, members_only: bool) -> list[str]:
    """One refit of ``state``; the mismatches this rank found (none off the generator)."""
    rank = dist.get_rank()

    def realized(mesh: fm.Mesh) -> Any:
        if members_only and mesh.coordinate(rank) is None:
            return None
        rm = fm.realize(mesh, members_only=members_only)
        return rm if rm.coordinate is not None else None

    rm_train, rm_gen = realized(trainer), realized(generator)
    got = fm.reshard(trainer_values(state, trainer, rm_train), generator_shardings(state, generator), mesh=rm_gen)
    if rm_gen is None:
        assert got is None, f"rank {rank} is no generator rank but got {type(got)}"
        return []
    return mismatches(state, got, generator, rm_gen)


def planned(state: dict[str, Any], trainer: fm.Mesh, generator: fm.Mesh) -> tuple[int, int]:
    """The plans' bytes between ranks and their stages (one exchange each), over the whole state dict."""
    plans = [fm.plan_reshard(NamedSharding(trainer, a), NamedSharding(generator, b), shape, dtype)
             for shape, dtype, a, b in state.values()]
    return sum(p.bytes_moved for p in plans), max(p.stages for p in plans)


def main() -> None:
    if not dist.is_initialized():  # members-only realize needs the job's default group (its store)
        dist.init_process_group()
    world = fm.make_mesh((8,), ("r",))
    cases = {
        "disjoint: trainer (dp_shard 2, tp 2) on ranks 0-3 -> generator (dp 2, tp 2) on ranks 4-7": (
            world.take(r=slice(0, 4)).unflatten("r", {"dp_shard": 2, "tp": 2}),
            world.take(r=slice(4, 8)).unflatten("r", {"dp": 2, "tp": 2}), True),
        "colocated: trainer (dp_shard 4, tp 2) -> generator (dp 2, tp 4) on ranks 0-7": (
            fm.make_mesh((4, 2), ("dp_shard", "tp")), fm.make_mesh((2, 4), ("dp", "tp")), False),
    }
    state = transformer_state()
    n_bf16 = sum(dtype == torch.bfloat16 for _, dtype, _, _ in state.values())
    for label, (trainer, generator, members_only) in cases.items():
        bad = refit(state, trainer, generator, members_only=members_only)
        count = torch.tensor([len(bad)])
        dist.all_reduce(count)  # every rank learns whether a generator rank found a mismatch
        assert count.item() == 0, f"rank {dist.get_rank()}: {label}: mismatches {bad}"
        if dist.get_rank() == 0:
            nbytes, stages = planned(state, trainer, generator)
            print(f"refit {label}: {len(state)} tensors ({n_bf16} bf16, {len(state) - n_bf16} fp32), "
                  f"{nbytes} bytes between ranks in {stages} stages: bit for bit on every generator rank")
    fm.clear_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
