"""The bounds of the engines' KV event wire, shared by its decoder (kvtop/sources/kv_wire.py, the spec) and the
decoder's accelerator (kvtop/sources/kv_wire_fast.py), so that both refuse the same messages."""

U64 = 1 << 64          # hashes are unsigned 64-bit on the wire (signed ones are wrapped)
MAX_EVENTS = 100_000   # one engine step's batch; a message claiming more is not a KV event batch
MAX_HASHES = 1_000_000
MAX_SMALL = 1 << 20    # ranks, block sizes, KV cache groups: small numbers; a larger one is not this format

__all__ = ["MAX_EVENTS", "MAX_HASHES", "MAX_SMALL", "U64"]
