"""Errors a user can cause and fix. The CLI turns them into one paragraph on stderr and exit code 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad params, bad data or a missing file: the message names what to fix."""

    exit_code = 2
    # Whether the params may be what is wrong: a command given -S puts params.yaml back when this is raised. False for
    # an error after stages ran on the overrides and DVC recorded them (the params are not in question).
    params_in_question = True


class ParamsError(UserError):
    """One or more invalid parameters; `problems` holds (dotted path, message) pairs, all of them."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        n = len(problems)
        lines = [f"{source}: {n} invalid parameter{'s' if n != 1 else ''}:"]
        lines += [f"  {path}: {msg}" for path, msg in problems]
        lines.append("Fix params.yaml or the -S override, then rerun (`trainflow params schema` lists every field).")
        super().__init__("\n".join(lines))


class DataError(UserError):
    """The data cannot be used as configured: the message names the file, column or row."""


class DiskFullError(UserError):
    """A write hit a full filesystem (or a quota, or a file-size limit). Not retried, since it would fail the same way;
    exit code 1, a failure of the machine rather than of params or data. The message names the path, says what is
    intact, and what to do."""

    exit_code = 1


class ServiceError(Exception):
    """A service the pipeline talks to (the MLflow tracking server) failed, and rerunning once it answers will succeed.

    Not a UserError: exit code 1, and Prefect retries the task. The message names the service and what to rerun.
    """

    exit_code = 1


PREEMPTED = 75  # EX_TEMPFAIL (sysexits.h): a temporary failure, try again; distinct from 1 (failed) and 2 (user error)


class Preempted(Exception):
    """Training stopped at an update boundary with a checkpoint (a signal, train.max_time), to be resumed by a rerun:
    exit code PREEMPTED (trainflow.engine.preempt)."""

    exit_code = PREEMPTED
