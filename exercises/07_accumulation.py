# %% [markdown]
# # Step 7: gradient accumulation
#
# Step 2 with each process's batch split into `--micro-batches` parts: a forward and a backward
# each, the gradients adding up, one optimizer step per batch. It trains the same weights as step 2
# on a GPU too small for the whole batch at once. DDP would average the gradients after every
# backward; once per step is enough, on the last micro-batch.
#
#     torchrun --nproc-per-node 2 exercises/07_accumulation.py --micro-batches 2
#     harness check exercises/07_accumulation.py
#
# `diff solutions/02_ddp.py solutions/07_accumulation.py` shows what accumulation adds.

# %%
import contextlib
import gc
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

from harness import workshop

args = workshop.parse_args("Step 7: DDP with gradient accumulation", accumulation=True)
torch.manual_seed(args.seed)
workshop.use_launcher_environment()  # torchrun's variables under any launcher (srun, mpiexec)

# Join the other ranks in a process group; one GPU per rank
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
# Give each rank its own part of every epoch's training samples
# One permutation of the training set per epoch, the same on every rank, dealt out so that
# each rank takes its own part: torch's DistributedSampler does this when it knows the number of
# ranks, this rank and the seed. The DataLoader below takes it as its sampler.
sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=args.seed)
train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True)
# Give each rank its own part of the test set, each image exactly once
# Each rank scores a different part of the test set, and every image exactly once: a Subset
# of the test set whose indices differ per rank (every world_size-th image, from this rank's). A
# DistributedSampler would pad the set with repeated images to share it out evenly.
test_set = Subset(test_set, range(rank, len(test_set), world_size))
test_loader = DataLoader(test_set, batch_size=256)

# %% [markdown]
# The model and the optimizer. The ranks train what one process would on the `world_size` times
# larger global batch at the same learning rate (notebook 01); the rate that batch asks for is
# notebook 02's rule (the learning-rate TODO below).

# %%
model = workshop.build_model(args.dropout).to(device)
# Wrap the model in DistributedDataParallel, then seed each rank's dropout apart
# DDP broadcasts rank 0's weights to every rank when it is built, and averages the gradients over
# the ranks during backward. Its device_ids are the rank's GPU, or None on the CPU.
# Every rank was seeded alike, so with dropout on each rank would drop the same units at the same
# place in its batch, where one process gives every sample of the global batch its own draw: once
# the weights are shared, seed torch again from --seed and the rank, so that the ranks' random
# numbers differ.
model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
torch.manual_seed(args.seed * 1000 + rank + 1)
# Scale the learning rate for the global batch: by the square root of the number of ranks
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
optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)

# %% [markdown]
# Training. Only rank 0 prints, after the ranks' sums and counts are added up.

# %%
for epoch in range(args.epochs):
    # Make the sampler deal out a new order this epoch, the same on every rank
    # Without telling the sampler which epoch it is, every epoch repeats the first one's order.
    # The sampler draws its permutation from the seed and the epoch number it was last told.
    sampler.set_epoch(epoch)
    train_sums = torch.zeros(2, device=device)  # summed loss, samples
    for images, labels in train_loader:
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad()
        parts = list(zip(images.tensor_split(args.micro_batches), labels.tensor_split(args.micro_batches)))
        for number, (part_images, part_labels) in enumerate(parts, 1):
            # TODO 1: average the gradients over the ranks once per step: on the last micro-batch
            # DDP allreduces the gradients in every backward of the wrapped model, unless the forward
            # and the backward run inside the wrapper's no_sync context: then the gradients only add
            # up on each rank. Make `sync`, the context the micro-batch below runs in, DDP's no_sync
            # for every micro-batch but the last, and a context that does nothing for the last: its
            # backward then averages the summed gradients over the ranks, one allreduce per step
            # instead of one per micro-batch. The math is the same either way; the saving is
            # communication.
            workshop.todo(1, "average the gradients over the ranks once per step: on the last micro-batch")
            with sync:
                # This part's share of the batch's mean loss: the parts' gradients add up to the batch's.
                loss = F.cross_entropy(model(part_images), part_labels, reduction="sum")
                (loss / len(labels)).backward()
            train_sums += torch.stack([loss.detach(), torch.tensor(float(len(part_labels)), device=device)])
        optimizer.step()
    # The plain model: DDP's forward may talk to the other ranks, which score other numbers of batches.
    test_sums = workshop.evaluate(model.module, test_loader, device)  # summed loss, correct, samples
    # Add up the sums and counts of all ranks, then print them once
    # Each rank's sums cover only its part of the data: add the sums and counts of all ranks
    # together in place (an all-reduce with the default sum), never average the ranks' averages; then
    # rank 0 alone prints them, through workshop.report.
    dist.all_reduce(train_sums)
    dist.all_reduce(test_sums)
    if rank == 0:
        workshop.report(epoch, train_sums, test_sums)

# Save the weights once, from rank 0, and leave the process group
# Every rank holds the same weights, so rank 0 alone saves them, as the state dict of the model
# inside DDP: the wrapper's own state dict names every weight with a `module.` prefix that the
# plain model does not load. Then leave: DDP holds on to the process group, so delete the model and
# collect the garbage first (it sits in reference cycles), else the group's threads outlive Python
# and the process can abort at exit ("terminate called without an active exception"); then destroy
# the process group.
if rank == 0:
    torch.save(model.module.state_dict(), args.save)
del model
gc.collect()
dist.destroy_process_group()
