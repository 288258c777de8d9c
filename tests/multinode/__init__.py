"""Tests across several nodes, each a Linux network namespace on this machine (netns_cluster.py)."""
