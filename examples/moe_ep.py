"""A mixture of experts with expert parallelism, without a capacity, in one fm.shard_map; checked.

Run:  torchrun --nproc_per_node=8 examples/moe_ep.py [--steps 3] [--untyped] [--compile]

1. A (dp, ep) = (2, 4) mesh, realized once. The tokens ``x (TOKENS, DIM)`` are split by rows over
   both axes, ``P(("dp", "ep"), None)``. The router ``w_router (DIM, EXPERTS)`` is replicated,
   ``P()``. The 8 experts, each ``relu(x @ w1[e]) @ w2[e]``, are split over ep:
   ``w1 (EXPERTS, DIM, HIDDEN)`` and ``w2 (EXPERTS, HIDDEN, DIM)`` by ``P("ep", None, None)``, so
   member j of ep holds experts 2j and 2j + 1, and every dp row of the mesh holds them all.
2. The per-shard step (``moe``), every token routed to its top-2 experts, however many that sends
   where; nothing is dropped or padded:
       probs = softmax(x @ w_router); weights, experts = topk(probs, 2)
       sort the (token, expert) pairs by expert: rows grouped by destination member, in order
       counts[e] = pairs for expert e (these vary from rank to rank, zeros included)
       recv_counts = all_to_all(counts, "ep")      # what each member sends to each of my experts
       rows = ragged_all_to_all(x[sorted], "ep", send_sizes, recv_sizes)       # dispatch
       rows regrouped by local expert, each expert applied to its rows, put back in arrival order
       back = ragged_all_to_all(rows, "ep", recv_sizes, send_sizes)            # combine
       y = sum over the two pairs of a token: weight * back[unsorted]
   The router's probabilities weight the combine, so its gradient comes through the top-k weights;
   the experts' and the tokens' gradients come back through both exchanges (each one's backward
   is the other exchange). The sizes are passed, not left to ``recv_sizes=None`` (which exchanges
   the per-member counts): the receiver needs the per-expert counts anyway, to group its rows by
   expert and to send them back, so it gets them in one small all_to_all, as torchtitan's token
   dispatcher does. Eagerly the sizes are 1-D integer tensors (the library reads them).
3. ``--compile``: the step is compiled whole (``torch.compile(..., backend="aot_eager",
   fullgraph=True, dynamic=False)``), with the sizes as Python ints: an eager pass of the router
   first computes each rank's counts (``plan``), and the compiled step reads them as constants. A
   step whose counts differ from the last one's compiles again (dynamo guards on the ints). Sizes
   that are tensors inside a compiled region would be data-dependent shapes: ``ragged_all_to_all``
   refuses ``recv_sizes=None`` under compile with a ``MeshError``.
4. ``--untyped`` runs with ``check_vma=False`` (JAX's untyped convention); the default is typed.
5. One process, the same model on all the tokens, is the reference: at every step the output,
   the loss and the gradients of the router, both expert weights and the tokens must agree to
   1e-5 on every rank (float64), then both sides take the same SGD step.

Runs on CPU (gloo) and, unchanged, on CUDA (NCCL).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import functional_mesh as fm
from functional_mesh import P

DP, EP = 2, 4
EXPERTS, TOP_K = 8, 2  # EXPERTS divisible by EP
LOCAL = EXPERTS // EP  # experts per member of ep
DIM, HIDDEN, TOKENS = 8, 16, 64  # TOKENS divisible by DP * EP
LR, TOL = 0.5, 1e-5


def full_problem() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(TOKENS, DIM, generator=g, dtype=torch.float64)
    w_router = torch.randn(DIM, EXPERTS, generator=g, dtype=torch.float64)
    w1 = torch.randn(EXPERTS, DIM, HIDDEN, generator=g, dtype=torch.float64) / DIM ** 0.5
    w2 = torch.randn(EXPERTS, HIDDEN, DIM, generator=g, dtype=torch.float64) / HIDDEN ** 0.5
    target = torch.randn(TOKENS, DIM, generator=g, dtype=torch.float64)
    return x, w_router, w1, w2, target


def route(x: torch.Tensor, w_router: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's top-k router probabilities and experts, (tokens, TOP_K) each."""
    return torch.topk(torch.softmax(x @ w_router, dim=-1), TOP_K, dim=-1)


def counts_of(experts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs per expert from this rank, (EP, LOCAL), and what each member sends my experts, (EP, LOCAL)."""
    counts = torch.bincount(experts.reshape(-1), minlength=EXPERTS).reshape(EP, LOCAL)
    return counts, fm.all_to_all(counts, "ep", 0, 0)  # row j: member j's counts for my experts


def apply_experts(rows: torch.Tensor, recv_counts: list[list[int]], w1: torch.Tensor,
                  w2: torch.Tensor) -> torch.Tensor:
    """Rows arrive grouped by source member, then by local expert: regroup by expert, apply, put back."""
    blocks = list(rows.split([n for per_source in recv_counts for n in per_source]))  # [source * LOCAL + e]
    for e in range(LOCAL):
        mine = [s * LOCAL + e for s in range(EP)]
        out = torch.relu(torch.cat([blocks[i] for i in mine]) @ w1[e]) @ w2[e]
        for i, block in zip(mine, out.split([blocks[i].shape[0] for i in mine]), strict=True):
            blocks[i] = block
    return torch.cat(blocks)


def moe(x: torch.Tensor, w_router: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
        plan: tuple[list[int], list[list[int]]] | None = None) -> torch.Tensor:
    """One shard's MoE layer. ``plan``: (send_sizes, recv_counts) as Python ints (compiled), or
    ``None``: counted and exchanged here, the sizes passed as tensors (eager)."""
    weights, experts = route(x, w_router)
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)  # by expert, so by destination member too
    token = order // TOP_K  # pair p belongs to token p // TOP_K
    if plan is None:
        counts, recv = counts_of(experts)
        send_sizes, recv_sizes, recv_counts = counts.sum(1), recv.sum(1), recv.tolist()
    else:
        send_sizes, recv_counts = plan
        recv_sizes = [sum(per_source) for per_source in recv_counts]
    rows = fm.ragged_all_to_all(x[token], "ep", send_sizes, recv_sizes)  # dispatch
    out = apply_experts(rows, recv_counts, w1, w2)
    back = fm.ragged_all_to_all(out, "ep", recv_sizes, send_sizes)  # combine: the inverse exchange
    unsorted = torch.empty_like(back).index_copy(0, order, back)  # pair order again
    return (unsorted.reshape(-1, TOP_K, DIM) * weights.unsqueeze(-1)).sum(1)


def plan_of(x: torch.Tensor, w_router: torch.Tensor) -> torch.Tensor:
    """This rank's (send_sizes, recv_counts) as one (1, EP, 1 + LOCAL) block, for the compiled step."""
    counts, recv = counts_of(route(x, w_router)[1])
    return torch.cat([counts.sum(1, keepdim=True), recv], dim=1).unsqueeze(0)


def reference(x: torch.Tensor, w_router: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One process, every token, every expert's weights gathered per (token, choice)."""
    weights, experts = route(x, w_router)
    h = torch.relu(torch.einsum("td,tkdh->tkh", x, w1[experts]))
    return (torch.einsum("tkh,tkhd->tkd", h, w2[experts]) * weights.unsqueeze(-1)).sum(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--untyped", action="store_true", help="check_vma=False (JAX's untyped convention)")
    parser.add_argument("--compile", action="store_true", help="sizes as Python ints, the step compiled whole")
    args = parser.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    if world != DP * EP:
        raise SystemExit(f"moe_ep.py needs {DP * EP} processes, got {world}")
    rm = fm.realize(fm.make_mesh((DP, EP), ("dp", "ep")), products=[("dp", "ep")])  # one gather of tokens
    tokens, experts_spec = P(("dp", "ep"), None), P("ep", None, None)
    x_full, r_full, w1_full, w2_full, target = full_problem()
    x = x_full.clone().requires_grad_()  # full tensor: enters as its block; its gradient comes out whole
    w_router = fm.distribute(r_full.clone(), fm.NamedSharding(rm.mesh, P()), mesh=rm).requires_grad_()
    w1 = fm.distribute(w1_full.clone(), fm.NamedSharding(rm.mesh, experts_spec), mesh=rm).requires_grad_()
    w2 = fm.distribute(w2_full.clone(), fm.NamedSharding(rm.mesh, experts_spec), mesh=rm).requires_grad_()
    ref = [t.clone().requires_grad_() for t in (x_full, r_full, w1_full, w2_full)]
    check_vma = not args.untyped
    specs = dict(in_specs=(tokens, P(), experts_spec, experts_spec), out_specs=tokens, mesh=rm, check_vma=check_vma)

    if args.compile:
        current: dict[str, tuple] = {}  # this step's sizes, read by the traced step as constants
        planner = fm.shard_map(plan_of, in_specs=(tokens, P()), out_specs=P(("dp", "ep")), mesh=rm,
                               check_vma=check_vma)
        compiled = torch.compile(fm.shard_map(lambda *a: moe(*a, plan=current["plan"]), **specs),
                                 backend="aot_eager", fullgraph=True, dynamic=False)

        def step(*a: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                block = planner(x.detach(), w_router.detach()).to_local()[0].tolist()
            current["plan"] = ([row[0] for row in block], [row[1:] for row in block])
            return compiled(*a)
    else:
        step = fm.shard_map(moe, **specs)

    worst = {"output": 0.0, "x": 0.0, "w_router": 0.0, "w1": 0.0, "w2": 0.0}
    losses = []
    for i in range(args.steps):
        y = step(x, w_router, w1, w2).full_tensor()
        loss = ((y - target) ** 2).mean()
        loss.backward()
        want = reference(*ref)
        want_loss = ((want - target) ** 2).mean()
        want_loss.backward()
        got = {"output": y.detach(), "x": x.grad, "w_router": w_router.grad.full_tensor(),
               "w1": w1.grad.full_tensor(), "w2": w2.grad.full_tensor()}
        for (name, value), expected in zip(got.items(), [want.detach()] + [t.grad for t in ref], strict=True):
            diff = (value - expected).abs().max().item()
            worst[name] = max(worst[name], diff)
            assert diff <= TOL, f"rank {rm.rank}: step {i} {name} differs from one process by {diff:.3g}"
        assert abs(loss.item() - want_loss.item()) <= TOL, f"rank {rm.rank}: step {i} loss differs"
        losses.append(loss.item())
        with torch.no_grad():
            for p in (w_router, w1, w2, *ref[1:]):
                p -= LR * p.grad
                p.grad = None
            x.grad = ref[0].grad = None

    if rm.rank == 0:
        chosen = route(x_full, r_full)[1].reshape(DP * EP, -1)  # rank r's pairs: row r (tokens split row-major)
        per_rank = torch.stack([torch.bincount(row, minlength=EXPERTS) for row in chosen])
        print(f"mesh {rm.mesh} on {rm.backend}, check_vma={check_vma}, compiled={args.compile}")
        if args.compile:  # one graph per distinct set of sizes, none broken (fullgraph=True)
            print(f"graphs compiled: {torch._dynamo.utils.counters['stats']['unique_graphs']} in {args.steps} steps")
        print(f"tokens per expert at step 0 (top-{TOP_K} of {TOKENS}): {per_rank.sum(0).tolist()}; "
              f"(rank, expert) pairs sending 0 rows: {(per_rank == 0).sum().item()} of {per_rank.numel()}")
        print("losses " + " ".join(f"{v:.6f}" for v in losses))
        print("max abs difference " + ", ".join(f"{k} {v:.2g}" for k, v in worst.items()))
        print(f"output and every gradient match a single process to {TOL:g} on every rank")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
