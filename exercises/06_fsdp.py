# %% [markdown]
# # Step 6: sharded data parallelism with PyTorch FSDP2
#
# The same training as step 2, with FSDP2's `fully_shard` in place of DDP. DDP keeps a whole copy
# of the weights, gradients and optimizer state on every rank; FSDP keeps one piece of each per
# rank. A block of layers gathers its whole weights from all ranks only while it computes, and
# each rank receives only its piece of the averaged gradients (a reduce-scatter), so each rank's
# optimizer steps only its piece. The math is step 2's: the same averaged gradients, the same step.
#
#     torchrun --nproc-per-node 2 exercises/06_fsdp.py
#     harness check exercises/06_fsdp.py
#
# `diff solutions/02_ddp.py solutions/06_fsdp.py` shows what changes from DDP.

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

args = workshop.parse_args("Step 6: the workshop CNN on the embedded digits, with PyTorch FSDP2")
torch.manual_seed(args.seed)
workshop.use_launcher_environment()  # torchrun's variables under any launcher (srun, mpiexec)

# TODO 1: join the other ranks in a process group; one GPU per rank
# The launcher tells each rank its place (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR...):
# init_process_group reads them. NCCL talks between GPUs, gloo between CPUs.
# The local rank (the rank within its node) picks the GPU, not the global rank: each node
# numbers its GPUs from 0 (harness check --simulate-nodes 2 runs the ranks as on 2 nodes).
workshop.todo(1, "join the other ranks in a process group; one GPU per rank")

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
# TODO 2: give each rank its own part of every epoch's training samples
# DistributedSampler(dataset, num_replicas=..., rank=..., seed=...) deals them out; the
# DataLoader below takes it as its sampler.
workshop.todo(2, "give each rank its own part of every epoch's training samples")
train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True)
# TODO 3: give each rank its own part of the test set, each image exactly once
# torch.utils.data.Subset(test_set, indices) with a range of indices that differs per rank.
workshop.todo(3, "give each rank its own part of the test set, each image exactly once")
test_loader = DataLoader(test_set, batch_size=256)

# %% [markdown]
# The model and the optimizer. The global batch is `world_size` times the batch of one process,
# so the learning rate is too (linear scaling, Goyal et al. 2017): then each step moves the weights
# as one process with the whole global batch would. The optimizer is made after sharding, over
# the sharded weights: each rank's optimizer state covers its pieces only.

# %%
model = workshop.build_model(args.dropout).to(device)
# A plain model to evaluate: the sharded model's forward gathers weights from every rank, and the
# ranks score different numbers of test batches, so a rank would wait for peers that are done.
# (Built in a fork of the random state: the training draws the same random numbers as step 2.)
with torch.random.fork_rng(devices=[]):
    evaluation_model = workshop.build_model(args.dropout).to(device)
# TODO 4: start from rank 0's weights, then shard them over the ranks with fully_shard
# fully_shard does not broadcast: each rank keeps its own piece of its own copy, so ranks that drew
# different weights would train a patchwork of them. dist.broadcast(tensor, src=0) each tensor of
# model.state_dict() first. fully_shard(module) cuts each weight of `module` into one piece per
# rank and keeps this rank's, in place: call it on each layer with weights (the Conv2d and Linear
# layers: each is gathered whole only while it computes), then on the whole model. Its backward
# averages the gradients over the ranks.
workshop.todo(4, "start from rank 0's weights, then shard them over the ranks with fully_shard")
# TODO 5: scale the learning rate with the global batch: linearly, for SGD
# --lr is the rate for one process's batch of --batch-size; the global batch is world_size of them.
# SGD, as here, takes the linear rule (Goyal et al. 2017): args.lr x world_size. With Adam the
# square-root rule, args.lr x sqrt(world_size), is the usual one (notebook 02): harness check
# expects the rule of the optimizer your script steps.
workshop.todo(5, "scale the learning rate with the global batch: linearly, for SGD")
optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)

# %% [markdown]
# Training. Only rank 0 prints, after the ranks' sums and counts are added up.

# %%
for epoch in range(args.epochs):
    # TODO 6: make the sampler deal out a new order this epoch, the same on every rank
    # Without it, every epoch repeats the first one's order. sampler.set_epoch(...)
    workshop.todo(6, "make the sampler deal out a new order this epoch, the same on every rank")
    train_sums = torch.zeros(2, device=device)  # summed loss, samples
    for images, labels in train_loader:
        images, labels = images.to(device), labels.to(device)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        train_sums += torch.stack([loss.detach() * len(labels), torch.tensor(float(len(labels)), device=device)])
    # TODO 7: copy the whole weights into the evaluation model, on every rank
    # get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)) gathers every
    # weight's pieces into whole tensors: a collective, so every rank calls it, and gets them all.
    workshop.todo(7, "copy the whole weights into the evaluation model, on every rank")
    test_sums = workshop.evaluate(evaluation_model, test_loader, device)  # summed loss, correct, samples
    # TODO 8: add up the sums and counts of all ranks, then print them once
    # dist.all_reduce(tensor) sums a tensor over the ranks in place (never average the ranks'
    # averages); rank 0 prints with workshop.report(epoch, train_sums, test_sums). Its own sums
    # cover only its part of the data.
    workshop.todo(8, "add up the sums and counts of all ranks, then print them once")

# TODO 9: save the whole weights once, from rank 0, and leave the process group
# No rank holds the whole weights: gather them, on every rank (a collective), with
# StateDictOptions(full_state_dict=True, cpu_offload=True): then rank 0 alone gets them, in
# host memory, and saves them. Then leave: free the sharded model first (del model;
# gc.collect()), as in step 2; then dist.destroy_process_group().
workshop.todo(9, "save the whole weights once, from rank 0, and leave the process group")
