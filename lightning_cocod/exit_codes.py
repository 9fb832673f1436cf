"""Exit codes shared by the strategies, the launchers and the app (importing this costs nothing)."""

# sysexits.h EX_TEMPFAIL, "a temporary failure; the user is invited to retry": every rank stopped
# at the same step on a preemption signal, after writing a checkpoint. Schedulers can requeue on it.
PREEMPTED_EXIT_CODE = 75
