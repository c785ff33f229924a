"""Membership: peers that leave and join mid-training, and the rest going on (placeholder doc)."""
