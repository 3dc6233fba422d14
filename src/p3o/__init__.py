"""p3o: RL post-training that stays stable off-policy."""

__version__ = "0.1.0"
