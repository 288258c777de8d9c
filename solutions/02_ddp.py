# %% [markdown]
# # Step 2: data parallelism with PyTorch DDP
#
# Every process (a *rank*) runs this whole file. Each trains on its own part of every batch, DDP
# averages the gradients over the ranks, and every rank takes the same step: together they train
# what one process would with a batch `world_size` times larger.
#
#     torchrun --nproc-per-node 2 solutions/02_ddp.py
#     harness check solutions/02_ddp.py        # is it right? (runs it at 2 ranks and compares)
#
# `diff solutions/01_serial.py solutions/02_ddp.py` shows what data parallelism adds.

# %%
import gc
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

from harness import workshop

args = workshop.parse_args("Step 2: the workshop CNN on the embedded digits, with PyTorch DDP")
torch.manual_seed(args.seed)
workshop.use_launcher_environment()  # torchrun's variables under any launcher (srun, mpiexec)

# TODO(process-group): join the other ranks in a process group; one GPU per rank
# The launcher tells each rank its place (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR...):
# init_process_group reads them. NCCL talks between GPUs, gloo between CPUs.
# The local rank (the rank within its node) picks the GPU, not the global rank: each node
# numbers its GPUs from 0 (harness check --simulate-nodes 2 runs the ranks as on 2 nodes).
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
# DistributedSampler(dataset, num_replicas=..., rank=..., seed=...) deals them out; the
# DataLoader below takes it as its sampler.
sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=args.seed)
# END TODO
train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True)
# TODO(eval-shard): give each rank its own part of the test set, each image exactly once
# torch.utils.data.Subset(test_set, indices) with a range of indices that differs per rank.
test_set = Subset(test_set, range(rank, len(test_set), world_size))
# END TODO
test_loader = DataLoader(test_set, batch_size=256)

# %% [markdown]
# The model and the optimizer. The global batch is `world_size` times the batch of one process,
# so the learning rate is too (linear scaling, Goyal et al. 2017): then each step moves the weights
# as one process with the whole global batch would.

# %%
model = workshop.build_model(args.dropout).to(device)
# TODO(wrap): wrap the model in DistributedDataParallel
# DDP broadcasts rank 0's weights to every rank when it is built, and averages the gradients over
# the ranks during backward. device_ids: the rank's GPU, or None on the CPU.
model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
# END TODO
# TODO(lr): scale the learning rate with the global batch: linearly, for SGD
# --lr is the rate for one process's batch of --batch-size; the global batch is world_size of them.
# SGD, as here, takes the linear rule (Goyal et al. 2017): args.lr x world_size. With Adam the
# square-root rule, args.lr x sqrt(world_size), is the usual one (notebook 02): harness check
# expects the rule of the optimizer your script steps.
lr = args.lr * world_size
# END TODO
optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)

# %% [markdown]
# Training. Only rank 0 prints, after the ranks' sums and counts are added up.

# %%
for epoch in range(args.epochs):
    # TODO(reshuffle): make the sampler deal out a new order this epoch, the same on every rank
    # Without it, every epoch repeats the first one's order. sampler.set_epoch(...)
    sampler.set_epoch(epoch)
    # END TODO
    train_sums = torch.zeros(2, device=device)  # summed loss, samples
    for images, labels in train_loader:
        images, labels = images.to(device), labels.to(device)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        train_sums += torch.stack([loss.detach() * len(labels), torch.tensor(float(len(labels)), device=device)])
    # The plain model: DDP's forward may talk to the other ranks, which score other numbers of batches.
    test_sums = workshop.evaluate(model.module, test_loader, device)  # summed loss, correct, samples
    # TODO(metrics): add up the sums and counts of all ranks, then print them once
    # dist.all_reduce(tensor) sums a tensor over the ranks in place (never average the ranks'
    # averages); rank 0 prints with workshop.report(epoch, train_sums, test_sums). Its own sums
    # cover only its part of the data.
    dist.all_reduce(train_sums)
    dist.all_reduce(test_sums)
    if rank == 0:
        workshop.report(epoch, train_sums, test_sums)
    # END TODO

# TODO(save): save the weights once, from rank 0, and leave the process group
# Every rank holds the same weights; model.module is the model inside DDP.
# Then leave: DDP holds on to the process group, so free it first (del model; gc.collect(),
# it sits in reference cycles), else the group's threads outlive Python and the process can
# abort at exit ("terminate called without an active exception"); then dist.destroy_process_group().
if rank == 0:
    torch.save(model.module.state_dict(), args.save)
del model
gc.collect()
dist.destroy_process_group()
# END TODO
