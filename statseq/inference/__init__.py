"""Pure array maths for sequence models: no model objects, no fitting."""
