# %% [markdown]
# # Step 1: the workshop CNN on the embedded digits, in one process
#
# The starting point. Every later step adds data parallelism to this file, and
# `diff solutions/01_serial.py solutions/02_ddp.py` shows exactly what that takes.
#
#     python solutions/01_serial.py
#
# `--batch-size` is this process's batch and `--lr` its learning rate.

# %%
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, RandomSampler

from harness import workshop

args = workshop.parse_args("Step 1: the workshop CNN on the embedded digits, in one process")
torch.manual_seed(args.seed)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# %% [markdown]
# The data: a new order every epoch, drawn from `--seed` and the epoch number, so that a run can be
# repeated exactly. The last, incomplete batch of an epoch is dropped.

# %%
train_set = workshop.digits("train", args.train_samples)
test_set = workshop.digits("test")
shuffle = torch.Generator()
train_loader = DataLoader(
    train_set, batch_size=args.batch_size, sampler=RandomSampler(train_set, generator=shuffle), drop_last=True
)
test_loader = DataLoader(test_set, batch_size=256)

# %% [markdown]
# The model and the optimizer.

# %%
model = workshop.build_model(args.dropout).to(device)
lr = args.lr
optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)

# %% [markdown]
# Training. The loss is kept as a sum over samples with a count, not as an average: sums add up
# over batches (and, from step 2 on, over processes); averages of averages do not.

# %%
for epoch in range(args.epochs):
    shuffle.manual_seed(args.seed + epoch)
    train_sums = torch.zeros(2, device=device)  # summed loss, samples
    for images, labels in train_loader:
        images, labels = images.to(device), labels.to(device)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        train_sums += torch.stack([loss.detach() * len(labels), torch.tensor(float(len(labels)), device=device)])
    test_sums = workshop.evaluate(model, test_loader, device)  # summed loss, correct, samples
    workshop.report(epoch, train_sums, test_sums)

torch.save(model.state_dict(), args.save)
