"""Does a step on N ranks equal the step of one process? The gradients and the parameters
after one AdamW step, FSDP2 against a single process, on the same global micro-batch.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m throughputlab.distributed.parity \\
        --model tiny --case float32:4 --case bfloat16:4 --case float32:4:sum --out parity.pt

Every rank builds the model from the same seed and takes one :class:`FSDPTrainer` step on the
same global micro-batch (its own slice of it); the reduced gradients and the parameters after
the step are gathered in full (``DTensor.full_tensor``). Rank 0 then takes the step in one
process on the whole micro-batch and saves both (``torch.save``): a list of cases, each
``{"dtype", "micro_batch", "summed", "activation_checkpointing", "fsdp": {"grads", "params"},
"reference": {...}}``.

The reference in bfloat16 mirrors the mixed-precision policy: float32 master weights, the
forward and backward on a bfloat16 copy of the parameters (buffers unchanged), the gradients
cast to float32 for AdamW. A case ``DTYPE:B:sum`` runs with FSDP summing the ranks' gradients
instead of averaging them (gradient divide factor 1 with ``set_force_sum_reduction_for_comms``,
as gloo has no pre-multiplied sum): what the comparison must catch. ``DTYPE:B:ac`` runs with
activation checkpointing, which must not change the step.
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import asdict, dataclass
from typing import Optional

import torch

from throughputlab.backends.torch_common import build_model
from throughputlab.distributed.ranks import RankContext, init_ranks, leave
from throughputlab.distributed.trainer import FSDPTrainer
from throughputlab.models import ResolvedModel, resolve_model


def reference_step(resolved: ResolvedModel, dtype: str, ids: torch.Tensor, *, seed: int = 0,
                   lr: float = 1e-5) -> dict[str, dict[str, torch.Tensor]]:
    """One process, the whole micro-batch: gradients and parameters after one AdamW step (CPU)."""
    master = build_model(resolved, "float32", "cpu", seed)
    master.train()
    if dtype == "bfloat16":
        compute = copy.deepcopy(master)
        for p in compute.parameters():  # parameters only: FSDP's policy leaves buffers alone
            p.data = p.data.to(torch.bfloat16)
        compute(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        for (_, p), (_, q) in zip(master.named_parameters(), compute.named_parameters()):
            p.grad = q.grad.to(torch.float32)
    else:
        master(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in master.named_parameters()}
    torch.optim.AdamW(master.parameters(), lr=lr, weight_decay=0.0).step()
    params = {n: p.detach().clone() for n, p in master.named_parameters()}
    return {"grads": grads, "params": params}


def fsdp_step(ctx: RankContext, resolved: ResolvedModel, dtype: str, ids: torch.Tensor, *, seed: int = 0,
              lr: float = 1e-5, divide_factor: Optional[float] = None,
              activation_checkpointing: bool = False) -> dict[str, dict[str, torch.Tensor]]:
    """One FSDP2 step on every rank; the full gradients and parameters (on every rank, CPU)."""
    from torch.distributed.fsdp import FSDPModule

    trainer = FSDPTrainer(ctx, resolved, dtype=dtype, seed=seed, lr=lr,
                          activation_checkpointing=activation_checkpointing)
    trainer.start()
    model = trainer.model
    if divide_factor is not None:
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(divide_factor)
                m.set_force_sum_reduction_for_comms(True)  # SUM, then divide: gloo has no PREMUL_SUM
    grads: dict[str, torch.Tensor] = {}

    def gather_grads() -> None:
        for n, p in model.named_parameters():
            grads[_plain(n)] = p.grad.full_tensor().detach().to("cpu", torch.float32).clone()

    trainer.step(ids, after_backward=gather_grads)
    params = {_plain(n): p.full_tensor().detach().to("cpu", torch.float32).clone() for n, p in model.named_parameters()}
    trainer.close()
    return {"grads": grads, "params": params}


@dataclass(frozen=True)
class Case:
    dtype: str
    micro_batch: int
    summed: bool = False  # FSDP sums the ranks' gradients instead of averaging them
    activation_checkpointing: bool = False


def parse_case(text: str) -> Case:
    """``DTYPE:B[:sum][:ac]``, e.g. ``float32:4``, ``bfloat16:4:sum``, ``float32:4:ac``."""
    dtype, _, rest = text.partition(":")
    b, *flags = rest.split(":")
    if dtype not in ("float32", "bfloat16") or not b.isdigit() or int(b) < 1 or set(flags) - {"sum", "ac"}:
        raise argparse.ArgumentTypeError(f"--case takes DTYPE:MICRO_BATCH[:sum][:ac] with DTYPE float32 or bfloat16, "
                                         f"got {text!r}")
    return Case(dtype, int(b), "sum" in flags, "ac" in flags)


def _plain(name: str) -> str:
    """A parameter's name without the activation-checkpointing wrapper's level."""
    return name.replace("._checkpoint_wrapped_module", "")


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m throughputlab.distributed.parity", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--case", type=parse_case, action="append",
                    help="DTYPE:MICRO_BATCH[:sum][:ac], repeatable (default float32:4); sum: FSDP sums the ranks' "
                         "gradients instead of averaging them; ac: activation checkpointing")
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    code = 0
    try:
        ctx = init_ranks(args.device, threads=None, timeout_s=300)
        resolved = resolve_model(args.model)
        cases, refs = [], {}
        for case in args.case or [Case("float32", 4)]:
            gen = torch.Generator().manual_seed(args.seed + 1)
            ids = torch.randint(4, resolved.spec.vocab_size, (case.micro_batch, args.seq_len), generator=gen)
            out = fsdp_step(ctx, resolved, case.dtype, ids, seed=args.seed, lr=args.lr,
                            divide_factor=1.0 if case.summed else None,
                            activation_checkpointing=case.activation_checkpointing)
            if ctx.is_main:
                key = (case.dtype, case.micro_batch)
                if key not in refs:
                    refs[key] = reference_step(resolved, case.dtype, ids, seed=args.seed, lr=args.lr)
                cases.append({**asdict(case), "fsdp": out, "reference": refs[key]})
        if ctx.is_main:
            torch.save({"world_size": ctx.world_size, "lr": args.lr, "cases": cases}, args.out)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    leave(code, clean=code == 0)


if __name__ == "__main__":
    main()
