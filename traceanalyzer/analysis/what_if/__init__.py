"""The what-if family: step time if communication were free (``comm_free``), its range (``range``), the profiler's
own cost (``profiler_cost``), and the replay of the run's dependency graph (``dep_graph``, ``replay``, ``simulate``)."""
