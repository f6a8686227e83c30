"""Tiny hand-made Kineto traces for the loader tests (written the way Kineto writes them: µs with 3 decimals)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

_RAW = re.compile(r'"@@([-+0-9.eE]+)"')


def us(ns: int) -> float:
    """A ns count written as Kineto does, ``"{}.{:03}"`` µs, parsed back to a float (as JSON readers do)."""
    return float(us_text(ns))


def us_text(ns: int) -> str:
    sign = "-" if ns < 0 else ""
    return f"{sign}{abs(ns) // 1000}.{abs(ns) % 1000:03d}"


def event(cat: str, name: str, start_ns: int, dur_ns: int, *, pid: int | str = 1, tid: int | str = 1,
          **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": us(start_ns), "dur": us(dur_ns),
            "args": args}


def kernel(name: str, start_ns: int, dur_ns: int, *, device: int = 0, stream: int = 7, correlation: int = 1,
           external_id: int = 1, grid: list[int] | None = None, block: list[int] | None = None) -> dict[str, Any]:
    return event("kernel", name, start_ns, dur_ns, pid=device, tid=stream, device=device, stream=stream,
                 correlation=correlation, **{"External id": external_id}, grid=grid or [1, 1, 1],
                 block=block or [128, 1, 1])


def sample_events() -> list[dict[str, Any]]:
    """One of each thing the loader reads; the expected values are spelled out in the tests."""
    step = [event("user_annotation", f"ProfilerStep#{n}", 1_000_000 * n, 900_000, **{"External id": n})
            for n in (2, 3, 4)]
    comms = event("cpu_op", "record_param_comms", 2_100_000, 50_000, **{
        "External id": 34, "Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
        "dtype": "BFloat16", "Group size": 2, "Process Group Name": "0", "Process Group Ranks": "[0, 1]",
        "Seq": 5})
    return [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": 1, "tid": 0, "args": {"name": "python"}},
        *step,
        event("cpu_op", "aten::mm", 2_000_000, 100_500, tid=11, **{"External id": 33}),
        comms,
        event("python_function", "model.py(12): forward", 2_000_100, 10_000),
        event("cuda_runtime", "cudaLaunchKernel", 2_010_000, 5_001, correlation=100, **{"External id": 33}),
        event("cuda_driver", "cuLaunchKernel_v3020", 2_020_000, 4_000, correlation=101, **{"External id": 34}),
        kernel("sm90_xmma_gemm_bf16", 2_050_123, 30_007, correlation=100, external_id=33, grid=[4, 2, 1],
               block=[128, 2, 1]),
        kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 2_090_000, 40_000, correlation=101, external_id=34,
               stream=9),
        event("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 2_200_000, 1_024, pid=0, tid=7, device=0,
              stream=7, correlation=102, bytes=65536),
        event("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 2_300_000, 2_000, pid=0, tid=7, device=0,
              stream=7, correlation=103, bytes=8),
        event("gpu_memcpy", "Memcpy PtoP (Device -> Device)", 2_400_000, 3_000, pid=0, tid=7, device=0,
              stream=7, correlation=104, bytes=4096),
        event("gpu_memset", "Memset (Device)", 2_500_000, 768, pid=0, tid=7, device=0, stream=7,
              correlation=105, bytes=4),
        event("gpu_user_annotation", "nccl:all_reduce", 2_090_000, 40_000, pid=0, tid=9, **{"External id": 34}),
        {"ph": "s", "id": 100, "pid": 1, "tid": 1, "ts": us(2_010_000), "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 100, "pid": 0, "tid": 7, "ts": us(2_050_123), "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
         "ts": us(0), "dur": us(5_000_000), "args": {"Op count": 0}},
        {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": us(5_000_000)},
    ]


def document(events: list[dict[str, Any]], *, rank: int | None = 0, world_size: int = 2,
             base_time_ns: int | None = 1_790_857_026_000_000_000) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320, "computeMajor": 9,
                              "computeMinor": 0, "numSms": 132},
                             {"id": 1, "name": "NVIDIA H200", "totalGlobalMem": 150109880320, "computeMajor": 9,
                              "computeMinor": 0, "numSms": 132}],
        "cupti_version": 130001,
        "traceEvents": events,
    }
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size,
                                  "nccl_version": "2.28.9"}
    if base_time_ns is not None:
        doc["baseTimeNanoseconds"] = base_time_ns
    return doc


def raw_number(text: str) -> str:
    """A JSON number written verbatim (``write`` unquotes it), e.g. ``1712195495519689.047`` that no float holds."""
    return f"@@{text}"


def write(path: Path, doc: dict[str, Any] | str | bytes) -> Path:
    """Write a trace: ``.gz`` suffix → gzip; no trailing newline, so every proper prefix is invalid JSON."""
    if isinstance(doc, dict):
        doc = _RAW.sub(r"\1", json.dumps(doc))
    data = doc.encode() if isinstance(doc, str) else doc
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return path
