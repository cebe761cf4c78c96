"""The journal's vocabulary: event kinds, the kinds that end a run, and run-error codes.

Every module that writes or reads the journal names a kind through these constants, so a
misspelt kind is a NameError at import rather than an event nobody folds. The wire format
is the string value; the constants never change what is stored.
"""

from __future__ import annotations

from typing import Any, Final

from lantern.nodes import notes

# -- a run's life ---------------------------------------------------------------------------
RUN_STARTED: Final = "run_started"
RUN_RESUMED: Final = "run_resumed"  # woken from a park: a decision, a child's end, a timeout
RUN_RECOVERED: Final = "run_recovered"  # re-driven after a crash or a lost executor
RUN_SUCCEEDED: Final = "run_succeeded"
RUN_FAILED: Final = "run_failed"
RUN_CANCELLED: Final = "run_cancelled"
RUN_REPINNED: Final = "run_repinned"  # an operator moved a code-first run to another version
RUN_PARKED: Final = "run_parked"  # a replica without the run's version left it to one that has it

# -- a step's life --------------------------------------------------------------------------
STEP_STARTED: Final = "step_started"
STEP_COMPLETED: Final = "step_completed"
STEP_FAILED: Final = "step_failed"
STEP_RETRYING: Final = "step_retrying"
STEP_WAITING: Final = "step_waiting"  # parked at an approval, a signal or on a sub-agent
STEP_RESUMED: Final = "step_resumed"
STEP_SKIPPED: Final = "step_skipped"  # no edge into it was taken (a when, an approval's on)
STEP_THROTTLED: Final = "step_throttled"  # a model call waits for room in a rate limit
# A signal wait took a signal: {signalId, name}, in the commit with the step's output (the
# payload); docs/signals.md.
SIGNAL_RECEIVED: Final = "signal_received"

# -- notes ----------------------------------------------------------------------------------
ANOMALY_DETECTED: Final = "anomaly_detected"
# A node's notes are named by the node layer (which may not import this one).
CONFIDENCE_EVALUATED: Final = notes.CONFIDENCE_EVALUATED
CONFIDENCE_GATE_BYPASSED: Final = notes.CONFIDENCE_GATE_BYPASSED

# -- a microVM's life (docs/runtime.md): data {vmId, nodeId, attempt}, and at its end
# {exitCode, reason}: exited (the workload ended by itself), timeout, killed, node_lost ---------
VM_SCHEDULED: Final = "vm_scheduled"
VM_STARTED: Final = "vm_started"
VM_EXITED: Final = "vm_exited"
VM_TERMINATED: Final = "vm_terminated"

# The kinds that end a run, and the run status each leaves.
TERMINAL_KINDS: Final = frozenset({RUN_SUCCEEDED, RUN_FAILED, RUN_CANCELLED})
FINAL_STATUS: Final = {RUN_SUCCEEDED: "succeeded", RUN_FAILED: "failed", RUN_CANCELLED: "cancelled"}

# -- run-error codes (a failed or cancelled run's ``error.code``) ---------------------------
E_STEP_FAILED: Final = "step_failed"
E_ANOMALY: Final = "anomaly_detected"
E_CANCELLED: Final = "cancelled"
E_RECOVERY_EXHAUSTED: Final = "recovery_exhausted"
E_MAX_TURNS: Final = "max_turns_exceeded"
E_WHEN_FAILED: Final = "when_failed"  # an edge's ``when`` could not be evaluated
E_BUDGET: Final = "budget_exceeded"  # carried by lantern.errors.BudgetExceeded.code
E_MICROVM_EXHAUSTED: Final = "microvm_resume_exhausted"  # a microVM run lost its third VM
E_WORKLOAD_FAILED: Final = "workload_failed"  # a microVM workload raised
E_ENTRYPOINT_IMPORT: Final = "entrypoint_import"  # its entrypoint did not import
# ... or imported but is not what the app registers (for the run's workspace)
E_ENTRYPOINT_NOT_REGISTERED: Final = "entrypoint_not_registered"
E_TIMEOUT: Final = "timeout"  # it ran past its timeoutS
E_INTERNAL: Final = "internal_error"  # its drive died of an error no step could own

CANCELLED: Final = {"code": E_CANCELLED, "message": "the run was cancelled on request"}


def run_error(code: str, message: str, **detail: Any) -> dict[str, Any]:
    """A run's ``error``: its code, a message for people, and what else the code names."""
    return {"code": code, "message": message, **detail}


def step_failed_error(step: str, error: dict[str, Any]) -> dict[str, Any]:
    """The run's error when step ``step`` failed for good with ``error`` (its to_json)."""
    return {"code": E_STEP_FAILED, "step": step, **error}


def anomaly_error(kind: str, detail: Any) -> dict[str, Any]:
    return run_error(E_ANOMALY, f"anomaly {kind} ({detail}) fails the run by its policy", kind=kind)
