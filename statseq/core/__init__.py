"""The filter protocol, generic recurrences, parameters and result types."""
