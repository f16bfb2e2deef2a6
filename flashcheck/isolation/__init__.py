"""Running kernels so that a crash, hang or lost CUDA context is one named failure: the child's
journal (`journal`), GPU faults named on the call that caused them (`faults`), what the engine adds to
the production kernels (`hooks`), the parent that supervises a run (`supervisor`), a forking
process for short pytest runs (`zygote`), and one compilation per binary per machine (`compile_lock`).

Isolation: a kernel that exits, crashes, hangs or kills the CUDA context is ONE named failure, and
the run goes on to a true summary. One design for `flashcheck check`, `replay` and `report`.

Every run is a supervised child process (`supervise`); the parent never runs a kernel, so it never
touches CUDA (no fork after CUDA init: children are spawned, each with a fresh context). The child
appends to a journal (one JSON-lines file per process in `$FLASHCHECK_JOURNAL`, written with
O_APPEND so a record survives `os._exit` or SIGKILL the instant it is written):

    plan (the tasks: pytest node ids, fixture paths, report inputs), start TASK (with its timeout),
    input (the case a property is about to check, kept for a fixture), call / ret (each kernel
    call), fault (a GpuFault's message), end TASK OUTCOME, crash (a crash explained by a parent),
    finished (the child reached its own end: an exit status 0 without it is a hard exit, not a pass).

A child that ends with a task started but not ended crashed in it: the parent names kernel, task,
input and cause ("the kernel exited with code 0", "killed by SIGSEGV", "did not return in 5 s"),
writes the in-flight case as a fixture, and starts a new child that skips every task already done
(`$FLASHCHECK_EXCLUDE`; a report re-runs everything and counts the crashed inputs as errors). A
watchdog kills a task past its deadline (pytest-timeout, method thread, fires first in pytest
children and dumps every stack; the watchdog is the backstop when it cannot). A GpuFault ends the
child on purpose, after its fixture is saved: its context is dead, a fresh child carries on.

Under xdist (`-n`) the workers are the journalling children and xdist restarts them; the
controller (`PytestJournal`) turns its "worker crashed" into the same named failure, and counts
tests never run (workers out of restarts) against what was collected. A plain `pytest` with no
parent and no `-n` cannot survive a hard exit; after a GpuFault it skips the rest of the session.
"""
