"""The finding rule ids, each spelled once: the rules stamp their findings with these, the registry
(:func:`traceanalyzer.findings.run_findings`) runs the rules in :data:`RULE_IDS` order, docs/FINDINGS.md has a
section per id and the tests check their ids against :data:`RULE_IDS`. The ids are part of the ``summary --json``
contract: add ids freely, never rename one."""

from __future__ import annotations

EXPOSED_COMMUNICATION = "exposed_communication"
COMM_SERIALIZED_WITH_COMPUTE = "comm_serialized_with_compute"
COMM_COMPUTE_CONTENTION = "comm_compute_contention"
COLLECTIVE_HOST_COST = "collective_host_cost"
ALLREDUCE_NOT_FUSED = "allreduce_not_fused"
NORM_NOT_FUSED = "norm_not_fused"
NCCL_SMALL_MESSAGES = "nccl_small_messages"
STRAGGLER_WAIT = "straggler_wait"
SLOW_RANK = "slow_rank"
LOW_COMM_BANDWIDTH = "low_comm_bandwidth"
HOST_BOUND_NO_CUDA_GRAPHS = "host_bound_no_cuda_graphs"
IDLE_GAPS_HOST_CAUSE = "idle_gaps_host_cause"
HOST_GAP_BETWEEN_PASSES = "host_gap_between_passes"
COLLECTIVES_WITHOUT_KERNELS = "collectives_without_kernels"
LOW_TENSOR_ACTIVITY = "low_tensor_activity"
GPU_POWER_UNDERUSE = "gpu_power_underuse"
MOE_EXPOSED_DISPATCH_COMBINE = "moe_exposed_dispatch_combine"
MOE_EXPERT_IMBALANCE = "moe_expert_imbalance"
MOE_ROUTING_OVERHEAD = "moe_routing_overhead"

#: Every rule id, in the order the rules run.
RULE_IDS: tuple[str, ...] = (
    EXPOSED_COMMUNICATION, COMM_SERIALIZED_WITH_COMPUTE, COMM_COMPUTE_CONTENTION, COLLECTIVE_HOST_COST,
    ALLREDUCE_NOT_FUSED, NORM_NOT_FUSED, NCCL_SMALL_MESSAGES, STRAGGLER_WAIT, SLOW_RANK, LOW_COMM_BANDWIDTH,
    HOST_BOUND_NO_CUDA_GRAPHS, IDLE_GAPS_HOST_CAUSE, HOST_GAP_BETWEEN_PASSES, COLLECTIVES_WITHOUT_KERNELS,
    LOW_TENSOR_ACTIVITY, GPU_POWER_UNDERUSE, MOE_EXPOSED_DISPATCH_COMBINE, MOE_EXPERT_IMBALANCE,
    MOE_ROUTING_OVERHEAD,
)
