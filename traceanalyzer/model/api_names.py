"""Names the analyses pick host rows by: CUDA API calls that block or synchronise the host or launch a CUDA graph,
and CPU ranges named like a collective's issue (NCCL NVTX ranges, ``c10d::`` ops).

Shared by the analyses and the nsys loader, which reads only the CUDA API rows the summary needs: the launches of
the kernels and memory operations, the calls named here, the calls inside an issuing range, and the start of
every call (``api_starts``; see ``loaders.nsys_api``).
"""

from __future__ import annotations

import re

#: CPU ranges that issue a collective (host_issue: the collective's host cost and its API calls).
ISSUE_OP = re.compile(r"^(c10d::|record_param_comms$|nccl:|ncclGroup|nccl[A-Z][A-Za-z]+$)|"
                      r"^(?i:all_?reduce|all_?gather|reduce_?scatter|all_?to_?all)$")
#: API calls that synchronise the host with the GPU (host_issue).
HOST_SYNC = re.compile(r"Synchronize")
#: API calls that launch a whole CUDA graph (findings: share of kernels launched from graphs).
GRAPH_LAUNCH = re.compile(r"GraphLaunch", re.IGNORECASE)
#: API calls that block the host (findings: what the host did during long GPU idle gaps).
HOST_BLOCKING = re.compile(r"Synchronize|^cudaMemcpy(?!.*Async)|^cuMemcpy(?!.*Async)|cudaMalloc|cudaFree|"
                           r"cudaHostAlloc|cudaStreamWaitEvent", re.IGNORECASE)
#: Every API-name pattern an analysis selects calls by (names without the ``_v\d+`` suffix).
SELECTED_API_NAMES = (HOST_SYNC, GRAPH_LAUNCH, HOST_BLOCKING)
