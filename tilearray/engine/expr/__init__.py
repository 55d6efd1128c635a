"""The lazy expression: node types and the NumPy protocol tables."""
