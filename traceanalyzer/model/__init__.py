"""The data model: the normalized :class:`~traceanalyzer.model.trace.Trace` and the vocabulary every layer reads
(table columns, buckets, collective kinds, errors, units, API names)."""
