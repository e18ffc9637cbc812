"""kvtop.engines."""
