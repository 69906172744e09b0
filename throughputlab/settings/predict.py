"""The settings of `throughputlab predict`, one validated tree: from a fitted profile, or analytic
from a model config and a datasheet row (with its layout and the generation engine). Each
field's description is the help of its flag."""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import Field

from throughputlab.predict_engine import EngineOptions
from throughputlab.records.base import SettingsRecord

PositiveInt = Annotated[int, Field(gt=0)]
Lengths = list[PositiveInt]


def _text(description: str, default=None):
    return Field(default, description=description)


class PredictGeneration(SettingsRecord):
    concurrency: Lengths = Field([1, 2, 4, 8, 16, 32, 64, 128, 256, 512], min_length=1,
                                 description="Concurrencies to predict.")
    prompt_len: Optional[PositiveInt] = _text("Prompt tokens (none: the profile's, or 512).")
    output_len: Optional[PositiveInt] = _text("Output tokens (none: the profile's, or 512).")


class PredictTraining(SettingsRecord):
    micro_batches: Lengths = Field([1, 2, 4, 8, 16], min_length=1, description="Training micro-batches.")
    seq_len: Optional[PositiveInt] = _text("Training sequence length (none: the profile's, or 2048).")


class PredictLayout(SettingsRecord):
    gpus: Optional[PositiveInt] = _text(
        "Analytic prediction: devices in all (none: --tp x --nodes, one engine a node). Generation runs in "
        "GPUS/TP engines; training is FSDP over all of them.")
    tp: PositiveInt = Field(1, description="Analytic prediction: tensor-parallel size of each generation engine "
                                           "(within a node).")
    nodes: PositiveInt = Field(1, description="Analytic prediction: machines the GPUs are spread over (FSDP then "
                                              "crosses the network).")
    train_tp: PositiveInt = Field(1, description="Analytic prediction: training's tensor-parallel size (FSDP x TP, "
                                                 "2D, within a node): each micro-batch runs on a TP group, its "
                                                 "activations all-reduced twice a layer each pass; tokens/s per GPU.")
    activation_checkpointing: Optional[str] = _text(
        "Analytic prediction: none, selective (the attention core recomputed, ~4% more FLOPs) or full (each "
        "block's forward recomputed: 4x instead of 3x forward FLOPs, far less activation memory); the bare flag "
        "means full.")


class PredictSpec(SettingsRecord):
    """Everything `predict` needs; `--spec FILE` holds any part of it, flags and `--set` override it."""

    profile: Optional[str] = _text("Predict from this profile's fitted model (fitted now if it has no fit).")
    model: Optional[str] = _text("Analytic prediction: a preset, model folder or hub id.")
    gpu: Optional[str] = _text("Analytic prediction: a device with a datasheet row (h200, a100 80gb, l4...).")
    dtype: str = Field("bfloat16", description="Analytic prediction: weights and compute dtype.")
    calibrate: Optional[str] = _text(
        "Analytic prediction with the efficiencies fitted on this measured profile (another device).")
    generation: PredictGeneration = PredictGeneration()
    training: PredictTraining = PredictTraining()
    layout: PredictLayout = PredictLayout()
    engine: EngineOptions = EngineOptions()
