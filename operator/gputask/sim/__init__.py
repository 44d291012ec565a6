"""Simulation on the pure core: the scenario runner and the Alibaba trace replay."""
