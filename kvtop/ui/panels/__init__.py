"""The dashboard's panels, one per module, each with its typed data class beside it (made by kvtop/ui/views.py)."""
