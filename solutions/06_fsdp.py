# %% [markdown]
# # Step 6: sharded data parallelism with PyTorch FSDP2
#
# The same training as step 2, with FSDP2's `fully_shard` in place of DDP. DDP keeps a whole copy
# of the weights, gradients and optimizer state on every rank; FSDP keeps one piece of each per
# rank. A block of layers gathers its whole weights from all ranks only while it computes, and
# each rank receives only its piece of the averaged gradients (a reduce-scatter), so each rank's
# optimizer steps only its piece. The math is step 2's: the same averaged gradients, the same step.
# Each process's batch is split into `--micro-batches` parts, a forward and a backward each (gradient
# accumulation, as in step 7): FSDP reduce-scatters the gradients once per step, after the last.
#
#     torchrun --nproc-per-node 2 solutions/06_fsdp.py
#     harness check solutions/06_fsdp.py
#
# `diff solutions/02_ddp.py solutions/06_fsdp.py` shows what changes from DDP.
#
# What sharding is for: `harness check` trains this step once more, at 4 ranks, on the CNN grown to
# 70.9M parameters (`--width 1536 --hidden-layers 24`), each rank allowed 800 MiB beyond what Python
# and torch hold. Whole, its weights, gradients and momentum alone take 811 MiB a rank. Sharded layer
# by layer they take a quarter of that, and a layer is gathered whole only while it computes; the
# model sharded as one unit is gathered whole at once, and runs out.

# %%
import gc
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, Subset

from harness import workshop

args = workshop.parse_args(
    "Step 6: the workshop CNN on the embedded digits, with PyTorch FSDP2", accumulation=True, memory=True
)
torch.manual_seed(args.seed)
workshop.use_launcher_environment()  # torchrun's variables under any launcher (srun, mpiexec)

# TODO(process-group): join the other ranks in a process group; one GPU per rank
# The launcher tells each rank its place in environment variables (RANK, WORLD_SIZE,
# LOCAL_RANK, MASTER_ADDR...), and torch.distributed's process group reads them as it starts: NCCL
# talks between GPUs, gloo between CPUs. Then the group knows this rank and the world size. The
# local rank (the rank within its node) picks the GPU, not the global rank: each node numbers its
# GPUs from 0 (harness check --simulate-nodes 2 runs the ranks as on 2 nodes).
dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
local_rank = int(os.environ["LOCAL_RANK"])
device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)
# END TODO

# %% [markdown]
# The data. Every epoch one permutation of the training set, the same on every rank, is dealt
# out: rank r takes every `world_size`-th sample from position r. So one step's batches of all
# ranks together hold the samples one process would take with the `world_size` times larger batch.
#
# Evaluation scores every test image exactly once: DistributedSampler would pad the 297 images
# to 298 with a duplicate so that both ranks get 149.

# %%
train_set = workshop.digits("train", args.train_samples)
test_set = workshop.digits("test")
# TODO(shard): give each rank its own part of every epoch's training samples
# One permutation of the training set per epoch, the same on every rank, dealt out so that
# each rank takes its own part: torch's DistributedSampler does this when it knows the number of
# ranks, this rank and the seed. The DataLoader below takes it as its sampler.
sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=args.seed)
# END TODO
train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True)
# TODO(eval-shard): give each rank its own part of the test set, each image exactly once
# Each rank scores a different part of the test set, and every image exactly once: a Subset
# of the test set whose indices differ per rank (every world_size-th image, from this rank's). A
# DistributedSampler would pad the set with repeated images to share it out evenly.
test_set = Subset(test_set, range(rank, len(test_set), world_size))
# END TODO
test_loader = DataLoader(test_set, batch_size=256)

# %% [markdown]
# The model and the optimizer. The ranks train what one process would on the `world_size` times
# larger global batch at the same learning rate (notebook 01); the rate that batch asks for is
# notebook 02's rule (the learning-rate TODO below). The optimizer is made after sharding, over the sharded weights:
# each rank's optimizer state covers its pieces only.

# %%
model = workshop.build_model(args.dropout, args.width, args.hidden_layers).to(device)
# TODO(shard-model): start from rank 0's weights, shard them with fully_shard, then seed each rank's dropout apart
# fully_shard does not broadcast: each rank keeps its own piece of its own copy, so ranks that
# drew different weights would train a patchwork of them. Send rank 0's value of every tensor of
# the model's state dict to every rank first. Then shard: fully_shard cuts each weight of the
# module it is given into one piece per rank and keeps this rank's, in place. Give it each layer
# with weights (the Conv2d and Linear layers: each is gathered whole only while it computes), then
# the whole model. Its backward averages the gradients over the ranks.
# Every rank was seeded alike, so with dropout on each rank would drop the same units at the same
# place in its batch, where one process gives every sample of the global batch its own draw: once
# the weights are shared, seed torch again from --seed and the rank, so that the ranks' random
# numbers differ.
for tensor in model.state_dict().values():
    dist.broadcast(tensor, src=0)
for layer in model.modules():
    if isinstance(layer, (torch.nn.Conv2d, torch.nn.Linear)):
        fully_shard(layer)
fully_shard(model)
torch.manual_seed(args.seed * 1000 + rank + 1)
# END TODO
# TODO(lr): scale the learning rate for the global batch: by the square root of the number of ranks
# --lr is the rate tuned for one process training on --batch-size samples per step. Together the
# ranks train what one process would on their world_size times larger global batch, at the same rate
# (notebook 01): no rate is needed to make them equal that process. The rate follows the global batch
# because that batch takes world_size times fewer steps per epoch than one process with --batch-size.
# Notebook 02's rule: multiply the one-process learning rate by the square root of the number of
# ranks, and warm it up to that per step from the one-process rate over the first epoch (the warmup is
# step 5's; without one, the scaled rate holds from the first step). For SGD, as here, notebook 02's
# runs could not reject no scaling or the linear rule (x world_size), so harness check accepts those
# too; for Adam they rejected both, and it accepts the square root only.
lr = args.lr * world_size**0.5
# END TODO
optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)

# %% [markdown]
# Training. Only rank 0 prints, after the ranks' sums and counts are added up.

# %%
for epoch in range(args.epochs):
    # TODO(reshuffle): make the sampler deal out a new order this epoch, the same on every rank
    # Without telling the sampler which epoch it is, every epoch repeats the first one's order.
    # The sampler draws its permutation from the seed and the epoch number it was last told.
    sampler.set_epoch(epoch)
    # END TODO
    train_sums = torch.zeros(2, device=device)  # summed loss, samples
    for images, labels in train_loader:
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad()
        parts = list(zip(images.tensor_split(args.micro_batches), labels.tensor_split(args.micro_batches)))
        for number, (part_images, part_labels) in enumerate(parts, 1):
            # TODO(gradient-sync): reduce-scatter the gradients once per step: on the last micro-batch
            # The sharded model reduce-scatters each layer's gradients over the ranks after its
            # backward, on every micro-batch, unless told not to: its set_requires_gradient_sync(False)
            # keeps the whole gradients on each rank, adding up, and True (before the last
            # micro-batch's forward) has that backward reduce-scatter their sum, once per step instead
            # of once per micro-batch. The math is the same either way; the saving is communication.
            model.set_requires_gradient_sync(number == len(parts))
            # END TODO
            # This part's share of the batch's mean loss: the parts' gradients add up to the batch's.
            loss = F.cross_entropy(model(part_images), part_labels, reduction="sum")
            (loss / len(labels)).backward()
            train_sums += torch.stack([loss.detach(), torch.tensor(float(len(part_labels)), device=device)])
        optimizer.step()
    # The sharded model evaluates on its pieces: each layer's forward gathers its weights, as in
    # training, so it is a collective and every rank runs as many as the others. Here they do: each
    # rank's part of the 297 test images fits in one batch of 256. (With parts of unequal batch
    # counts, a rank with fewer would run one more forward on images it does not count.)
    test_sums = workshop.evaluate(model, test_loader, device)  # summed loss, correct, samples
    # TODO(metrics): add up the sums and counts of all ranks, then print them once
    # Each rank's sums cover only its part of the data: add the sums and counts of all ranks
    # together in place (an all-reduce with the default sum), never average the ranks' averages; then
    # rank 0 alone prints them, through workshop.report.
    dist.all_reduce(train_sums)
    dist.all_reduce(test_sums)
    if rank == 0:
        workshop.report(epoch, train_sums, test_sums)
    # END TODO

# TODO(save): save the whole weights once, from rank 0, and leave the process group
# No rank holds the whole weights: torch.distributed.checkpoint's model state dict, asked for the
# full state dict, gathers every weight's pieces into whole tensors. It is a collective, so every rank
# asks; asked also to offload them to the CPU, rank 0 alone gets them, in host memory, and saves them. A sharded model's own state dict holds DTensors, each rank's pieces, which a plain model
# cannot load. Then leave: delete the sharded model and collect the garbage first, as in step 2;
# then destroy the process group.
weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if rank == 0:
    torch.save(weights, args.save)
del model
gc.collect()
dist.destroy_process_group()
# END TODO
