"""Fitting: free functions over any model with the needed capability."""
