"""A manual expert-parallel region inside an FSDP2 + TP model: ``fm.shard_map(..., axis_names={"dp"})``; checked.

Run:  torchrun --nproc_per_node=8 examples/ep_in_fsdp_tp.py [--steps 2]

1. One (dp, tp) = (4, 2) mesh, realized once. A dense block ``h = x + fc2(relu(fc1(x)))`` is torch's own
   2-D parallelism: tensor parallel over tp (``fc1`` column-wise, ``fc2`` row-wise) and FSDP2
   ``fully_shard`` over dp, both on slices of ``rm.device_mesh``. Each dp rank holds its own rows of the
   batch; the two tp ranks of a dp rank hold the same rows.
2. A mixture of experts after it, ``out = h + moe(h)``, top-2 of 8 experts, no capacity. Expert parallelism
   borrows dp (torchtitan's EP from dp_shard): dp member ``j`` holds experts ``2j`` and ``2j + 1``. The
   layer is one region manual over dp only. Its tokens enter as ``P("dp")`` and the experts'
   weights ``w1 (8, DIM, HIDDEN)``, ``w2 (8, HIDDEN, DIM)`` as ``P("dp")``, while tp stays automatic: inside,
   each value is a DTensor over tp (the tokens replicated, ``w1`` split by hidden columns, ``w2`` by
   hidden rows). The dispatch is explicit, by axis name: the per-expert counts go through
   ``fm.all_to_all`` over dp, the rows through ``fm.ragged_all_to_all`` over dp, and back the same way.
   The experts' matmuls are torch's DTensor tensor parallelism over tp (a column-wise then a row-wise
   matmul, whose partial sum DTensor reduces over tp when the rows are made replicated again).
3. FSDP2 sums the dense gradients over dp (divide factor 1: the loss is a sum over the global batch); the
   region's boundary gives the experts' and the router's gradients as DTensors with their own placements.
4. One process, the same model on all the tokens, is the reference: at every step the loss and the
   gradients of the dense weights, the router and both expert weights agree to 1e-5 on every rank
   (float64); then both sides take the same SGD step.

Runs on CPU (gloo). Not run on a GPU: nothing in it is CPU-specific, but NCCL was not tried.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import functional_mesh as fm
from functional_mesh import P

DP, TP = 4, 2
EXPERTS, TOP_K = 8, 2
LOCAL = EXPERTS // DP  # experts per dp member
DIM, HIDDEN, TOKENS = 8, 16, 32  # TOKENS divisible by DP, HIDDEN by TP
LR, TOL = 0.1, 1e-5


class Dense(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(DIM, HIDDEN, dtype=torch.float64), nn.Linear(HIDDEN, DIM, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


def full_problem() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(TOKENS, DIM, generator=g, dtype=torch.float64)
    w_router = torch.randn(DIM, EXPERTS, generator=g, dtype=torch.float64)
    w1 = torch.randn(EXPERTS, DIM, HIDDEN, generator=g, dtype=torch.float64) / DIM ** 0.5
    w2 = torch.randn(EXPERTS, HIDDEN, DIM, generator=g, dtype=torch.float64) / HIDDEN ** 0.5
    target = torch.randn(TOKENS, DIM, generator=g, dtype=torch.float64)
    return x, w_router, w1, w2, target


def route(x: torch.Tensor, w_router: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.topk(torch.softmax(x @ w_router, dim=-1), TOP_K, dim=-1)


def moe(h: DTensor, w_router: DTensor, w1: DTensor, w2: DTensor) -> torch.Tensor:
    """One dp member's MoE layer, manual over dp; h, w_router, w1, w2 are DTensors over tp."""
    x, router = h.to_local(), w_router.to_local()  # replicated over tp: the whole value on every tp rank
    weights, experts = route(x, router)
    order = torch.argsort(experts.reshape(-1), stable=True)  # (token, choice) pairs by expert: by member too
    counts = torch.bincount(experts.reshape(-1), minlength=EXPERTS).reshape(DP, LOCAL)
    recv = fm.all_to_all(counts, "dp", 0, 0)  # row j: what member j sends each of my experts
    send_sizes, recv_sizes = counts.sum(1), recv.sum(1)
    rows = fm.ragged_all_to_all(x[order // TOP_K], "dp", send_sizes, recv_sizes)  # dispatch
    blocks = list(rows.split(recv.reshape(-1).tolist()))  # [source * LOCAL + expert]
    tp = w1.device_mesh
    for e in range(LOCAL):  # each local expert on its rows: tensor parallel over tp, by torch's DTensor
        mine = [s * LOCAL + e for s in range(DP)]
        inp = DTensor.from_local(torch.cat([blocks[i] for i in mine]), tp, [Replicate()])
        out = (torch.relu(inp @ w1[e]) @ w2[e]).redistribute(tp, [Replicate()]).to_local()
        for i, block in zip(mine, out.split([blocks[i].shape[0] for i in mine]), strict=True):
            blocks[i] = block
    back = fm.ragged_all_to_all(torch.cat(blocks), "dp", recv_sizes, send_sizes)  # combine
    unsorted = torch.empty_like(back).index_copy(0, order, back)
    return (unsorted.reshape(-1, TOP_K, DIM) * weights.unsqueeze(-1)).sum(1)


def reference_moe(x: torch.Tensor, w_router: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    weights, experts = route(x, w_router)
    hid = torch.relu(torch.einsum("td,tkdh->tkh", x, w1[experts]))
    return (torch.einsum("tkh,tkhd->tkd", hid, w2[experts]) * weights.unsqueeze(-1)).sum(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    if world != DP * TP:
        raise SystemExit(f"ep_in_fsdp_tp.py needs {DP * TP} processes, got {world}")
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)  # the check's full_tensor
    rm = fm.realize(fm.make_mesh((DP, TP), ("dp", "tp")))
    x_full, r_full, w1_full, w2_full, target = full_problem()

    torch.manual_seed(0)
    dense = Dense()
    dense_ref = copy.deepcopy(dense)
    parallelize_module(dense, rm["tp"].device_mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    fully_shard(dense, mesh=rm["dp"].device_mesh)
    dense.set_gradient_divide_factor(1.0)  # a sum over the global batch: FSDP2 sums the dp ranks' gradients

    def placed(t: torch.Tensor, spec: P) -> DTensor:
        return fm.distribute(t.clone(), fm.NamedSharding(rm.mesh, spec), mesh=rm).requires_grad_()

    w_router, w1 = placed(r_full, P()), placed(w1_full, P("dp", None, "tp"))
    w2 = placed(w2_full, P("dp", "tp", None))
    ref = [t.clone().requires_grad_() for t in (r_full, w1_full, w2_full)]
    layer = fm.shard_map(moe, in_specs=(P("dp"), P(), P("dp"), P("dp")), out_specs=P("dp"), mesh=rm,
                         axis_names={"dp"})
    dp = rm.local_rank("dp")
    rows = slice(dp * (TOKENS // DP), (dp + 1) * (TOKENS // DP))

    seen = {}
    losses = []
    for step in range(args.steps):
        h = dense(x_full[rows])  # this dp rank's rows, the same on both tp ranks
        tokens = DTensor.from_local(h, rm.device_mesh, [Shard(0), Replicate()])
        out = h + layer(tokens, w_router, w1, w2).to_local()
        loss = ((out - target[rows]) ** 2).sum() / TOKENS
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total, group=rm.group("dp"))

        h_ref = dense_ref(x_full)
        loss_ref = ((h_ref + reference_moe(h_ref, *ref) - target) ** 2).sum() / TOKENS
        loss_ref.backward()
        assert abs(total.item() - loss_ref.item()) <= TOL, f"rank {rm.rank} step {step}: loss differs"
        got = {f"dense.{n}": p.grad.full_tensor() for n, p in dense.named_parameters()}
        got.update(router=w_router.grad.full_tensor(), w1=w1.grad.full_tensor(), w2=w2.grad.full_tensor())
        want = {f"dense.{n}": p.grad for n, p in dense_ref.named_parameters()}
        want.update(router=ref[0].grad, w1=ref[1].grad, w2=ref[2].grad)
        for name, value in got.items():
            diff = (value - want[name]).abs().max().item()
            assert diff <= TOL, f"rank {rm.rank} step {step}: gradient of {name} differs by {diff:.3g}"
        if step == 0:
            seen = {"w1": tuple(w1.grad.placements), "fc1": tuple(dense.fc1.weight.placements)}
        losses.append(total.item())
        with torch.no_grad():
            for p in (*dense.parameters(), w_router, w1, w2, *dense_ref.parameters(), *ref):
                p -= LR * p.grad
                p.grad = None

    if rm.rank == 0:
        print(f"mesh {rm.mesh} on {rm.backend}: dense block FSDP2 over dp + TP over tp; MoE manual over dp only")
        print(f"w1 and its gradient placements {seen['w1']} (experts over dp, hidden over tp); "
              f"fc1.weight {seen['fc1']}")
        print("losses " + " ".join(f"{v:.6f}" for v in losses))
        print(f"loss and every gradient match a single process to {TOL:g} on every rank")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
