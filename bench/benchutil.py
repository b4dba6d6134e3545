"""benchutil.py — what bench_gpu.py and bench_cpu.py share: the repository
root and the commit id that names a results file."""
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git_commit():
    """Short HEAD id, '-dirty' when tracked files differ; 'nogit' without git. FD_COMMIT
    in the environment wins (the GPU machine's copy of .git can lag its work tree)."""
    if os.environ.get("FD_COMMIT"):
        return os.environ["FD_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        if not sha:
            return "nogit"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except Exception:
        return "nogit"
