"""A pipeline-style ring with fm.ppermute: activations hop stage to stage, gradients hop back.

Run:  torchrun --nproc_per_node=8 examples/pipeline_ring.py

1. A (pp, dp) = (4, 2) mesh, realized once. Stage s (coordinate s along pp) owns layer L_s, a
   small Linear (all four are created identically on every rank from a seed; a stage keeps
   only its own).
2. Every stage starts with its own microbatch x_s. Four times: apply the stage's layer, then
   pass the activation on with ``fm.ppermute(a, "pp", [(i, (i + 1) % 4) for i in range(4)])``.
   After four hops each microbatch is home again, having gone through all four layers in ring
   order: stage 0 holds L3(L2(L1(L0(x_0)))), stage 1 holds L0(L3(L2(L1(x_1)))), and so on.
   The two dp replicas run their own rings on their own data.
3. Each stage's loss is the mean square of its output; backward runs through ppermute's
   backward (the inverse permutation), so stage s's weight gradient collects the contributions
   of all four microbatches.
4. A single process composes the four layers in the same orders and sums the four losses: the
   output at every stage (stage 0 printed) and every stage's weight and bias gradient
   (L0's printed) must agree to 1e-5 on every rank.

Runs on CPU (gloo) and, unchanged, on CUDA (NCCL).
"""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
from torch import nn

import functional_mesh as fm

PP, DP = 4, 2
DIM = 6
MICRO = 3  # rows per microbatch
TOL = 1e-5
RING = [(i, (i + 1) % PP) for i in range(PP)]


def make_layers() -> nn.ModuleList:
    torch.manual_seed(0)
    return nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(PP))


def microbatches(dp_index: int) -> torch.Tensor:
    """(PP, MICRO, DIM): the microbatch of each stage of one dp replica's ring."""
    g = torch.Generator().manual_seed(10 + dp_index)
    return torch.randn(PP, MICRO, DIM, generator=g)


def stage_fn(layer: nn.Module, a: torch.Tensor) -> torch.Tensor:
    return torch.tanh(layer(a))


def loss_fn(out: torch.Tensor) -> torch.Tensor:
    return (out ** 2).mean()


def reference(layers: nn.ModuleList, xs: torch.Tensor) -> torch.Tensor:
    """Single process: microbatch s goes through L_s, L_s+1, ... (mod PP); the losses are summed."""
    outs = []
    for s in range(PP):
        a = xs[s]
        for hop in range(PP):
            a = stage_fn(layers[(s + hop) % PP], a)
        outs.append(a)
    sum(loss_fn(o) for o in outs).backward()
    return torch.stack(outs).detach()


def main() -> None:
    world = int(os.environ["WORLD_SIZE"])
    if world != PP * DP:
        raise SystemExit(f"pipeline_ring.py needs {PP * DP} processes, got {world}")
    mesh = fm.make_mesh((PP, DP), ("pp", "dp"))
    rm = fm.realize(mesh)
    rank, device = rm.rank, rm.device
    stage, dp_index = rm.local_rank("pp"), rm.local_rank("dp")

    layers = make_layers()
    ref_layers = copy.deepcopy(layers)
    layer = layers[stage].to(device)  # this stage's own layer
    xs = microbatches(dp_index)

    with rm:
        a = xs[stage].to(device)
        for _ in range(PP):  # each hop: compute on this stage, pass to the next one
            a = fm.ppermute(stage_fn(layer, a), "pp", RING)
        out = a  # this stage's microbatch, back home after the full ring
        loss_fn(out).backward()  # gradients travel the ring backwards (inverse permutation)

    want_out = reference(ref_layers, xs)
    ref = ref_layers[stage]
    checks = [
        (f"stage {stage} output", out.detach().cpu(), want_out[stage]),
        (f"L{stage}.weight grad", layer.weight.grad.cpu(), ref.weight.grad),
        (f"L{stage}.bias grad", layer.bias.grad.cpu(), ref.bias.grad),
    ]
    for name, got, want in checks:
        assert torch.allclose(got, want, atol=TOL, rtol=0), (
            f"rank {rank}: {name} differs by {(got - want).abs().max().item():.3g}")

    if rank == 0:
        print(f"mesh {mesh} realized on {rm.backend} ({rm.device_type}), world {world}")
        print(f"pp rings (one per dp replica): {mesh['pp'].groups().tolist()}; perm {RING}")
        print(f"stage 0 output after {PP} hops = L3(L2(L1(L0(x_0)))), row 0: "
              f"{[round(v, 5) for v in out[0].tolist()]}")
        print(f"max |diff| vs single process: output {(out.detach().cpu() - want_out[0]).abs().max().item():.2e}, "
              f"L0.weight grad {(layer.weight.grad.cpu() - ref.weight.grad).abs().max().item():.2e}")
        print(f"pipeline ring matches the single-process composition to {TOL:g} (outputs and grads, every stage)")

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
