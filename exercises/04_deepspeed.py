# %% [markdown]
# # Step 4: data parallelism with DeepSpeed
#
# The same training as step 2, with DeepSpeed's engine in place of DDP. The engine owns model and
# optimizer: its backward averages the gradients over the ranks, its step updates the weights.
# Its config has two traps: its batch size is the *global* one, and it clips gradients at norm 1.0
# unless told otherwise (DDP and Horovod do not clip, so the experiments would differ). Each
# process's batch is split into `--micro-batches` parts, a forward and a backward each (gradient
# accumulation, as in step 7): the engine averages the gradients once per step, after the last.
#
#     deepspeed --num_gpus 2 exercises/04_deepspeed.py
#     harness check exercises/04_deepspeed.py
#
# `diff solutions/02_ddp.py solutions/04_deepspeed.py` shows what changes from DDP.

# %%
import gc
import os

import deepspeed
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, Subset

from harness import workshop

args = workshop.parse_args("Step 4: the workshop CNN on the embedded digits, with DeepSpeed", accumulation=True)
torch.manual_seed(args.seed)
workshop.use_launcher_environment()  # torchrun's variables under any launcher (srun, mpiexec)
workshop.skip_deepspeed_shm_op()  # on a CPU: no 45 s compile of an op only inference uses

# TODO 1: join the other ranks; one GPU per rank
# DeepSpeed starts the torch.distributed process group from the launcher's variables (NCCL on
# GPUs, gloo on CPUs); then torch.distributed tells this rank and the world size, as in step 2.
# The local rank picks the GPU, not the global rank: each node numbers its GPUs from 0
# (harness check --simulate-nodes 2 runs the ranks as on 2 nodes).
workshop.todo(1, "join the other ranks; one GPU per rank")

# %% [markdown]
# The data: sharded as in step 2 (DeepSpeed could build the loader too, with
# `deepspeed.initialize(training_data=...)`; the sampler would be the same).

# %%
train_set = workshop.digits("train", args.train_samples)
test_set = workshop.digits("test")
# TODO 2: give each rank its own part of every epoch's training samples
# One permutation of the training set per epoch, the same on every rank, dealt out so that
# each rank takes its own part: torch's DistributedSampler does this when it knows the number of
# ranks, this rank and the seed. The DataLoader below takes it as its sampler.
workshop.todo(2, "give each rank its own part of every epoch's training samples")
train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True)
# TODO 3: give each rank its own part of the test set, each image exactly once
# Each rank scores a different part of the test set, and every image exactly once: a Subset
# of the test set whose indices differ per rank (every world_size-th image, from this rank's). A
# DistributedSampler would pad the set with repeated images to share it out evenly.
workshop.todo(3, "give each rank its own part of the test set, each image exactly once")
test_loader = DataLoader(test_set, batch_size=256)

# %% [markdown]
# The model, the optimizer and the engine. A torch optimizer keeps the math that of steps 2 and 3
# (DeepSpeed's own "Adam" would compile a C++ op on a CPU).

# %%
model = workshop.build_model(args.dropout).to(device)
# TODO 4: scale the learning rate for the global batch: by the square root of the number of ranks
# --lr is the rate tuned for one process training on --batch-size samples per step. Together the
# ranks train what one process would on their world_size times larger global batch, at the same rate
# (notebook 01): no rate is needed to make them equal that process. The rate follows the global batch
# because that batch takes world_size times fewer steps per epoch than one process with --batch-size.
# Notebook 02's rule: multiply the one-process learning rate by the square root of the number of
# ranks, and warm it up to that per step from the one-process rate over the first epoch (the warmup is
# step 5's; without one, the scaled rate holds from the first step). For SGD, as here, notebook 02's
# runs could not reject no scaling or the linear rule (x world_size), so harness check accepts those
# too; for Adam they rejected both, and it accepts the square root only.
workshop.todo(4, "scale the learning rate for the global batch: by the square root of the number of ranks")
optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
# TODO 5: write DeepSpeed's config: micro-batch, accumulation steps and global batch, and no gradient clipping
# DeepSpeed reads its batch settings from the config: "train_micro_batch_size_per_gpu" is what one
# rank's forward takes at a time (here one micro-batch: --batch-size must divide by
# --micro-batches), "gradient_accumulation_steps" how many micro-batches make one step (the engine
# averages the gradients over the ranks, and steps, on the last of them only), and
# "train_batch_size" the global batch (micro-batch x gradient accumulation steps x ranks), not one
# rank's. "gradient_clipping" is 1.0 unless set, and DDP and Horovod do not clip:
# 0 turns it off, so the experiments compare alike. "zero_optimization" stage 0 keeps ZeRO off;
# stages 1-3 partition the optimizer state, gradients and weights over the ranks, and then a torch
# optimizer needs "zero_allow_untested_optimizer" set to true.
workshop.todo(5, "write DeepSpeed's config: micro-batch, accumulation steps and global batch, and no gradient clipping")
# TODO 6: wrap model and optimizer in DeepSpeed's engine, then seed each rank's dropout apart
# DeepSpeed's initialize takes the model, the optimizer and the config, and returns the engine
# first (then the optimizer and two things this script does not use). The engine broadcasts rank
# 0's weights to every rank.
# Every rank was seeded alike, so with dropout on each rank would drop the same units at the same
# place in its batch, where one process gives every sample of the global batch its own draw: once
# the weights are shared, seed torch again from --seed and the rank, so that the ranks' random
# numbers differ.
workshop.todo(6, "wrap model and optimizer in DeepSpeed's engine, then seed each rank's dropout apart")

# %% [markdown]
# Training. Only rank 0 prints, after the ranks' sums and counts are added up.

# %%
for epoch in range(args.epochs):
    # TODO 7: make the sampler deal out a new order this epoch, the same on every rank
    # Without telling the sampler which epoch it is, every epoch repeats the first one's order.
    # The sampler draws its permutation from the seed and the epoch number it was last told.
    workshop.todo(7, "make the sampler deal out a new order this epoch, the same on every rank")
    train_sums = torch.zeros(2, device=device)  # summed loss, samples
    for images, labels in train_loader:
        images, labels = images.to(device), labels.to(device)
        parts = list(zip(images.tensor_split(args.micro_batches), labels.tensor_split(args.micro_batches)))
        for part_images, part_labels in parts:
            loss = F.cross_entropy(engine(part_images), part_labels)
            # TODO 8: backward and step through the engine, on every micro-batch
            # Backward and the optimizer's step go through the engine, not the loss and the optimizer,
            # on every micro-batch: the engine counts them. Its backward divides the loss by the
            # gradient accumulation steps, so that the micro-batches' gradients add up to the batch's,
            # and averages them over the ranks on the last micro-batch of a step only; its step then
            # updates the weights and zeroes the gradients (and does nothing on the others).
            workshop.todo(8, "backward and step through the engine, on every micro-batch")
            train_sums += torch.stack(
                [loss.detach() * len(part_labels), torch.tensor(float(len(part_labels)), device=device)]
            )
    test_sums = workshop.evaluate(engine.module, test_loader, device)  # summed loss, correct, samples
    # TODO 9: add up the sums and counts of all ranks, then print them once
    # Each rank's sums cover only its part of the data: add the sums and counts of all ranks
    # together in place (an all-reduce with the default sum), never average the ranks' averages; then
    # rank 0 alone prints them, through workshop.report.
    workshop.todo(9, "add up the sums and counts of all ranks, then print them once")

# TODO 10: save the weights once, from rank 0, and leave the process group
# Every rank holds the same weights: rank 0 alone saves the state dict of the model inside the
# engine. (With ZeRO stages 1-3 the engine's own checkpoint writes each rank's partition, from
# every rank.) Then leave: the engine holds on to the process group, so delete it and collect the
# garbage first (it sits in reference cycles), else the group's threads outlive Python and the
# process can abort at exit ("terminate called without an active exception"); then destroy the
# process group.
workshop.todo(10, "save the weights once, from rank 0, and leave the process group")
