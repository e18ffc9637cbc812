"""The Textual dashboard: the only package of kvtop that imports textual or rich."""
