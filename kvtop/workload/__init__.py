"""kvtop.workload."""
