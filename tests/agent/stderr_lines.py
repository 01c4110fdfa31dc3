"""The agent's lines and the job's own in a job's stderr, shared by the agent checkers (check_agent.py,
nccl/check_nccl.py, check_adversarial.py).

Every agent line starts with "gradscope:". Where the agent cannot tell that stderr is at the start of a
line (a pipe, a terminal), it writes a newline of its own first (docs/agent.md, "Life cycle, signals and
failures"): that empty line belongs to the agent's line, not to the job."""


def agent_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("gradscope:")]


def job_lines(stderr):
    """The job's own lines, in order."""
    lines = stderr.splitlines()
    return [line for i, line in enumerate(lines) if not line.startswith("gradscope:") and
            not (line == "" and i + 1 < len(lines) and lines[i + 1].startswith("gradscope:"))]


def misplaced_agent_lines(stderr):
    """Agent messages ("gradscope: ...") that do not start a line of their own (inside the job's line);
    "gradscope::" (a C++ name in a sanitizer's stack trace) is not one."""
    return [line for line in stderr.splitlines() if "gradscope: " in line and not line.startswith("gradscope: ")]
