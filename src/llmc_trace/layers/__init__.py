"""Every layer that computes ``x Wᵀ + b`` seen one way: widths and an ``(out, in)`` weight."""
