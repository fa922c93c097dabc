"""Attention through a block table: the Triton kernels and their launcher, the torch path,
the float64 reference, workloads, traced runs and their report, the GPU compile checks.

`api.paged_attention` is the entry point (also `pagetrace.paged_attention`). Nothing here
is imported by the package until it is used: torch and triton load with it.
"""
