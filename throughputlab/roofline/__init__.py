"""The throughput model's physics: every step cost, written once (equations: docs/model.md).

Small pure functions of the model constants (:class:`Costs`: W, k, F, a and what MoE needs)
and the rates (t0, BW, PHI). Each takes floats or numpy arrays alike (arrays broadcast; a
scalar in gives a float out), so the fit evaluates a sweep and the rollout simulation
thousands of steps in one call. ``fit``, ``predict``, ``report`` and ``decide`` call these
and derive nothing themselves. Times in seconds, sizes in bytes. No torch, no scipy.

``core``: one device's step times and knees; ``memory``: memory lines and KV capacity;
``devices``: collectives (rings over NVLink or the nodes' NICs, each GPU's own NIC), tensor-parallel
sharding, FSDP; ``engine``: an inference engine's KV rules, admission, decode fixed costs and host time;
``training``: padded and packed passes, token-budget micro-batches, the host time of a training pass,
Ulysses' all-to-alls and the RL loss's pass over the vocabulary. Import the names from here.
"""

from throughputlab.roofline.core import *  # noqa: F401,F403
from throughputlab.roofline.core import _out  # noqa: F401
from throughputlab.roofline.devices import *  # noqa: F401,F403
from throughputlab.roofline.engine import *  # noqa: F401,F403
from throughputlab.roofline.memory import *  # noqa: F401,F403
from throughputlab.roofline.training import *  # noqa: F401,F403
