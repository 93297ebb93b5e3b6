"""The gateway's wire: ``inference.proto`` and the stubs ``scripts/gen-protos`` generates from
it (committed, never edited by hand)."""
