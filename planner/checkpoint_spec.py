"""How a job checkpoints and how often it fails: the ``checkpoint`` block of TrainingSpec.

The cost of checkpoints and failures (planner.cost.checkpoint, planner.cost.failures,
formulas.md 12) needs three inputs beyond the model, the hardware and the layout:

- ``failures_per_gpu_hour``: unexpected job interruptions per GPU-hour of exposure. Default:
  Llama 3's, 419 unexpected interruptions in a 54-day snapshot of pre-training on 16,384 H100
  (Llama Team 2024, "The Llama 3 Herd of Models", arXiv:2407.21783, Sec. 3.3.4 and Table 5):
  419 / (54 x 24 h x 16,384) = 1.9733e-5 per GPU-hour, a job MTBF of 3.09 h on 16,384 GPUs.
  The paper says training used "up to 16K" GPUs; if part of the snapshot ran on fewer, the rate
  per GPU-hour was higher. The 47 planned interruptions are not counted.
- ``restart_time``: seconds from a failure to training again, BEFORE the checkpoint is read
  (detection, rescheduling, process and NCCL start-up); the load time is added by the cost
  model from the checkpoint size and the storage. Default 10 min: MegaScale (Jiang et al. 2024,
  arXiv:2402.15627, Sec. 6.3) reports failure detection and diagnostic tests in under 10 min on
  average and NCCL initialisation under 30 s on > 10,000 GPUs (Sec. 3.5); Daly 2006 uses
  R = 10 min in his Figs. 3-5.
- ``async_save``: the save copies the state to host memory and writes it in the background
  (Megatron-Core ``--async-save``, torchtitan ``checkpoint.async_mode``), so only the copy
  stalls training; False: the whole write stalls it.

SI inside: the failure rate is read per GPU-hour (as sources state it) and used per GPU-second
(``failures_per_gpu_s``).
"""

from __future__ import annotations

from pydantic import Field

from .quantities import Seconds, _Strict

LLAMA3_INTERRUPTIONS = 419  # unexpected interruptions, Llama 3 Sec. 3.3.4 / Table 5
LLAMA3_DAYS = 54            # the snapshot of pre-training they were counted in
LLAMA3_GPUS = 16_384        # H100 GPUs ("up to 16K")
LLAMA3_FAILURES_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)
LLAMA3_SOURCE = ("Llama 3 (arXiv:2407.21783, Sec. 3.3.4, Table 5): 419 unexpected interruptions "
                 "in 54 days on 16,384 H100")
DEFAULT_RESTART_S = 600.0  # MegaScale Sec. 6.3 (< 10 min detection + diagnosis); Daly's R


class CheckpointSpec(_Strict):
    """Failure rate, restart time and save mode of a training job (see the module docstring)."""

    failures_per_gpu_hour: float = Field(default=LLAMA3_FAILURES_PER_GPU_HOUR, gt=0.0, lt=1.0)
    restart_time: Seconds = DEFAULT_RESTART_S
    async_save: bool = True

    @property
    def failures_per_gpu_s(self) -> float:
        """The failure rate per GPU-second (SI)."""
        return self.failures_per_gpu_hour / 3600.0

    @property
    def default_rate(self) -> bool:
        """True when the failure rate is Llama 3's (the default)."""
        return self.failures_per_gpu_hour == LLAMA3_FAILURES_PER_GPU_HOUR
