"""Numeric helpers of every analysis: integer-ns interval algebra and small-table frames."""
