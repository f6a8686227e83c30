"""A tiny NVTX-annotated workload (3 steps of 2 layers: matmul + relu) for examples/nsys_rep_device.sh; with a path
argument it also writes a Kineto trace of CUDA-graph replays there."""
import sys

import torch

x = torch.randn(1024, 1024, device="cuda")
w = torch.randn(1024, 1024, device="cuda")
for _step in range(3):
    torch.cuda.nvtx.range_push("step")
    for layer in range(2):
        torch.cuda.nvtx.range_push(f"layer_{layer}")
        y = torch.relu(x @ w)
        torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
if len(sys.argv) > 1:  # a Kineto trace with CUDA-graph replays
    from torch.profiler import ProfilerActivity, profile
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            y = torch.relu(x @ w)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = torch.relu(x @ w)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(3):
            with torch.profiler.record_function("step"):
                g.replay()
                y2 = x @ w
        torch.cuda.synchronize()
    p.export_chrome_trace(sys.argv[1])
    print("torch", torch.__version__)
