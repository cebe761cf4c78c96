"""The microVM tier's metrics, on the process's /metrics beside the engine's."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

VMS = Gauge("lantern_vms", "VMs by state, as the scheduler leader last counted them", ["state"])
VM_START = Histogram(
    "lantern_vm_start_seconds",
    "From a VM's placement to its runtime node reporting it started, by driver",
    ["driver"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 30),
)
VM_ENDS = Counter("lantern_vm_ends", "VMs that ended, by reason", ["reason"])
RESUMES = Counter("lantern_microvm_resumes", "MicroVM runs placed again after a lost VM")
EXHAUSTED = Counter(
    "lantern_microvm_resume_exhausted", "MicroVM runs failed after their third lost VM"
)
LEADER = Gauge("lantern_scheduler_leader", "1 while this replica leads the scheduler")
