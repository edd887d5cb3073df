"""Hugging Face ``Trainer`` on tpu: the one piece transformers leaves out.

Selecting the device needs no code here: transformers finds tpu through
``torch.accelerator`` and accelerate through ``ACCELERATE_TORCH_DEVICE=tpu``
(docs/ECOSYSTEM.md).  What is missing is the tpu random generator in checkpoints:
``Trainer`` saves and restores the CPU, CUDA, NPU, HPU, MLU, MUSA and torch_xla
generators only, so after ``train(resume_from_checkpoint=...)`` dropout on tpu would
draw other masks than the uninterrupted run.  ``with_tpu_rng(cls)`` returns a
subclass of a Trainer class that also writes the tpu generator next to
``rng_state.pth`` and reads it back on resume.

Imports transformers: import this module only where transformers is installed.
"""

from __future__ import annotations

import os

import torch
import transformers


def _rng_file(trainer, directory: str) -> str:
    args = trainer.args
    name = (
        "rng_state_tpu.pth" if args.world_size <= 1 else f"rng_state_tpu_{args.process_index}.pth"
    )
    return os.path.join(directory, name)


def with_tpu_rng(trainer_cls: type) -> type:
    """A subclass of ``trainer_cls`` (``transformers.Trainer`` or a subclass of it)
    whose checkpoints carry the tpu generator state of every tpu device."""

    class _TpuRng(trainer_cls):
        def _save_rng_state(self, output_dir):
            super()._save_rng_state(output_dir)
            if self.args.device.type == "tpu":
                torch.save(torch.tpu.get_rng_state_all(), _rng_file(self, output_dir))

        def _load_rng_state(self, checkpoint):
            super()._load_rng_state(checkpoint)
            if checkpoint is None or self.args.device.type != "tpu":
                return
            path = _rng_file(self, checkpoint)
            if os.path.isfile(path):  # an older or CPU checkpoint has none
                torch.tpu.set_rng_state_all(torch.load(path, weights_only=True))

    _TpuRng.__name__ = _TpuRng.__qualname__ = trainer_cls.__name__
    _TpuRng.__module__ = __name__
    return _TpuRng


Trainer = with_tpu_rng(transformers.Trainer)
