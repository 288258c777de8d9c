"""Prediction: step time, throughput, efficiency and memory per rank of a task at a site's node
counts, said before the runs (`harness bench allreduce`, `harness predict`, `harness recommend`) and
set beside what they measured."""
