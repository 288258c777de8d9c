# %% [markdown]
# # Step 3: data parallelism with Horovod
#
# The same training as step 2, with Horovod in place of DDP: Horovod's optimizer averages the
# gradients over the ranks (allreduce), and rank 0's weights are broadcast to all ranks first.
# Each process's batch is split into `--micro-batches` parts, a forward and a backward each (gradient
# accumulation, as in step 7): the optimizer averages the gradients once per step, after the last.
#
#     horovodrun -np 2 -H localhost:2 python exercises/03_horovod.py
#     harness check exercises/03_horovod.py
#
# `diff solutions/02_ddp.py solutions/03_horovod.py` shows what changes from DDP.

# %%
import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, Subset

from harness import workshop

args = workshop.parse_args("Step 3: the workshop CNN on the embedded digits, with Horovod", accumulation=True)
torch.manual_seed(args.seed)

# TODO 1: start Horovod; one GPU per rank
# Horovod finds the other ranks as it starts (under horovodrun, mpirun or srun), and then
# tells this process its rank, the number of ranks and its local rank. The local rank picks the GPU,
# not the global rank: each node numbers its GPUs from 0 (harness check --simulate-nodes 2 runs the
# ranks as on 2 nodes).
workshop.todo(1, "start Horovod; one GPU per rank")

# %% [markdown]
# The data: sharded as in step 2.

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
# The model and the optimizer. Nothing wraps the model: Horovod wraps the optimizer, whose step
# waits for the averaged gradients. Every rank must start from the same weights, so rank 0's are
# broadcast (ranks seeded differently, or a checkpoint loaded on rank 0 only, would differ).

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
# TODO 5: start every rank from rank 0's weights and optimizer state, then seed each rank's dropout apart
# Each rank drew its own random weights: send rank 0's weights to every rank (Horovod has a
# broadcast for a whole state dict), and rank 0's optimizer state too, so that every rank starts
# from the same point.
# Every rank was seeded alike, so with dropout on each rank would drop the same units at the same
# place in its batch, where one process gives every sample of the global batch its own draw: once
# the weights are shared, seed torch again from --seed and the rank, so that the ranks' random
# numbers differ.
workshop.todo(5, "start every rank from rank 0's weights and optimizer state, then seed each rank's dropout apart")
# TODO 6: average the gradients over the ranks at every step, once: after the last micro-batch
# Horovod's DistributedOptimizer wraps the optimizer: it allreduces each gradient as backward
# produces it, before the step. It needs the model's named parameters, and its reduction must
# average the gradients (a sum would scale every step by the number of ranks). Each step below
# runs one backward per micro-batch: tell it how many (backward_passes_per_step), and it lets the
# gradients add up on each rank until the last of them, then allreduces once. Left at 1, Horovod
# stops the second backward of a step ("Gradients were computed more than backward_passes_per_step
# times before call to step()").
workshop.todo(6, "average the gradients over the ranks at every step, once: after the last micro-batch")

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
        optimizer.zero_grad()
        parts = list(zip(images.tensor_split(args.micro_batches), labels.tensor_split(args.micro_batches)))
        for part_images, part_labels in parts:
            # This part's share of the batch's mean loss: the parts' gradients add up to the batch's.
            loss = F.cross_entropy(model(part_images), part_labels, reduction="sum")
            (loss / len(labels)).backward()
            train_sums += torch.stack([loss.detach(), torch.tensor(float(len(part_labels)), device=device)])
        optimizer.step()
    test_sums = workshop.evaluate(model, test_loader, device)  # summed loss, correct, samples
    # TODO 8: add up the sums and counts of all ranks, then print them once
    # Each rank's sums cover only its part of the data: add the sums and counts of all ranks
    # together (Horovod's allreduce, with a sum as its operation), never average the ranks' averages;
    # then rank 0 alone prints them, through workshop.report.
    workshop.todo(8, "add up the sums and counts of all ranks, then print them once")

# TODO 9: save the weights once, from rank 0
# Every rank holds the same weights: rank 0 alone saves the model's state dict to args.save.
workshop.todo(9, "save the weights once, from rank 0")
