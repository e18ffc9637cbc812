"""kvtop.report."""
