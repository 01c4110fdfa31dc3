"""What preloading an instrumented agent takes, shared by the agent checkers (check_agent.py and
nccl/check_nccl.py): in ASan and TSan builds the agent links its sanitizer runtime, which must come first
in the initial library list, so it goes ahead of the agent in LD_PRELOAD."""
import subprocess


def sanitizer_runtime(library):
    """The sanitizer runtime that `library` links (ASan or TSan builds), else None."""
    try:
        listing = subprocess.run(["ldd", library], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in listing.splitlines():
        name, _, location = line.strip().partition(" => ")
        if name.startswith(("libasan.so", "libtsan.so")):
            return location.split(" (")[0]
    return None


def preload(agent):
    """LD_PRELOAD's value that loads the agent: the agent, after its sanitizer runtime in such builds."""
    runtime = sanitizer_runtime(agent)
    return f"{runtime}:{agent}" if runtime else agent
