"""kvtop.sinks."""
