"""The pipeline: loading (``loading``), worker processes (``workers``), the map and reduce of a summary (``stages``),
the Dask engine (``dask_engine``) and the orchestrator (``summarize``)."""
