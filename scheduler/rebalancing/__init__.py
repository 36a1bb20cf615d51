"""The rebalancer: moving a running pod off a node that breaks its tolerance."""
