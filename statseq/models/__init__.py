"""Model families: thin adapters over the filter protocol."""
