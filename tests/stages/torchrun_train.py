"""A training step of a saved plan under torchrun (used by test_launch.py; the script docs/torchrun.md shows).

Run as: torchrun --standalone --nproc-per-node 2 torchrun_train.py PLAN DATA OUT_DIR
Each rank writes what it computed to OUT_DIR/rank{RANK}.pt.
"""

import sys

import torch
import torch.distributed as dist
from torch import nn

from unitscale.stages import pipeline_stage

plan_path, data_path, out_dir = sys.argv[1:4]
data = torch.load(data_path)

# with example inputs, each stage is built with the real shapes and dtypes it receives and sends
rank = pipeline_stage(plan_path, num_microbatches=2, schedule="1f1b", loss_fn=nn.MSELoss(), example_inputs=data["x"])
losses: list[torch.Tensor] = []
output = rank.step(data["x"], target=data["y"], losses=losses)  # the output on the last stage's rank

grads = {n: p.grad for stage in rank.stages for n, p in stage.submod.named_parameters() if p.grad is not None}
torch.save({"output": output, "losses": losses, "grads": grads}, f"{out_dir}/rank{dist.get_rank()}.pt")
dist.destroy_process_group()
