# %% [markdown]
# # Step 3: data parallelism with Horovod
#
# The same training as step 2, with Horovod in place of DDP: Horovod's optimizer averages the
# gradients over the ranks (allreduce), and rank 0's weights are broadcast to all ranks first.
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

args = workshop.parse_args("Step 3: the workshop CNN on the embedded digits, with Horovod")
torch.manual_seed(args.seed)

# TODO 1: start Horovod; one GPU per rank
# hvd.init() finds the other ranks (under horovodrun, mpirun or srun); hvd.rank(), hvd.size() and
# hvd.local_rank() say where this process stands. The local rank picks the GPU, not the global
# rank: each node numbers its GPUs from 0 (harness check --simulate-nodes 2 runs the ranks as on 2 nodes).
workshop.todo(1, "start Horovod; one GPU per rank")

# %% [markdown]
# The data: sharded as in step 2.

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
# The model and the optimizer. Nothing wraps the model: Horovod wraps the optimizer, whose step
# waits for the averaged gradients. Every rank must start from the same weights, so rank 0's are
# broadcast (ranks seeded differently, or a checkpoint loaded on rank 0 only, would differ).

# %%
model = workshop.build_model(args.dropout).to(device)
# TODO 4: scale the learning rate with the global batch: linearly, for SGD
# --lr is the rate for one process's batch of --batch-size; the global batch is world_size of them.
# SGD, as here, takes the linear rule (Goyal et al. 2017): args.lr x world_size. With Adam the
# square-root rule, args.lr x sqrt(world_size), is the usual one (notebook 02): harness check
# expects the rule of the optimizer your script steps.
workshop.todo(4, "scale the learning rate with the global batch: linearly, for SGD")
optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
# TODO 5: start every rank from rank 0's weights and optimizer state
# hvd.broadcast_parameters(model.state_dict(), root_rank=0), and the same for the optimizer.
workshop.todo(5, "start every rank from rank 0's weights and optimizer state")
# TODO 6: average the gradients over the ranks at every step
# hvd.DistributedOptimizer(optimizer, named_parameters=..., op=hvd.Average) allreduces each
# gradient as backward produces it; op=hvd.Sum would add them up instead.
workshop.todo(6, "average the gradients over the ranks at every step")

# %% [markdown]
# Training. Only rank 0 prints, after the ranks' sums and counts are added up.

# %%
for epoch in range(args.epochs):
    # TODO 7: make the sampler deal out a new order this epoch, the same on every rank
    # Without it, every epoch repeats the first one's order. sampler.set_epoch(...)
    workshop.todo(7, "make the sampler deal out a new order this epoch, the same on every rank")
    train_sums = torch.zeros(2, device=device)  # summed loss, samples
    for images, labels in train_loader:
        images, labels = images.to(device), labels.to(device)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        train_sums += torch.stack([loss.detach() * len(labels), torch.tensor(float(len(labels)), device=device)])
    test_sums = workshop.evaluate(model, test_loader, device)  # summed loss, correct, samples
    # TODO 8: add up the sums and counts of all ranks, then print them once
    # hvd.allreduce(tensor, op=hvd.Sum) returns the sum over the ranks (never average the ranks'
    # averages); rank 0 prints with workshop.report(epoch, train_sums, test_sums). Its own sums
    # cover only its part of the data.
    workshop.todo(8, "add up the sums and counts of all ranks, then print them once")

# TODO 9: save the weights once, from rank 0
# Every rank holds the same weights.
workshop.todo(9, "save the weights once, from rank 0")
