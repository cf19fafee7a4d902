"""`tfcli graph`: the attribution graph of a prompt through per-layer transcoders, as circuit-tracer computes it."""
