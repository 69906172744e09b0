"""Efficiencies: the fractions of a device's peaks an engine reaches, stated as defaults or
calibrated from a measured profile (its fitted BW and PHI over that device's peaks), for the
analytic predictor in :mod:`throughputlab.predict`. No torch, no scipy."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict

from throughputlab import roofline as rf
from throughputlab.errors import UserError
from throughputlab.fit.load import load_or_fit
from throughputlab.records.fit import Peaks
from throughputlab.records.profile import Profile


class Efficiencies(BaseModel):
    """Fractions of the datasheet peaks a real engine reaches, and the fixed per-step costs.

    Defaults are assumptions, stated here and in every predicted profile: about 80% of the
    memory bandwidth in decode (vLLM reaches 70-85% MBU at batch 1 on A100/H100-class GPUs),
    half the dense FLOP/s for decode's skinny matmuls, 60% in prefill, 40% MFU in training
    (typical of FSDP/Megatron runs), 10 ms per micro-step. A decode step's fixed cost is
    ``roofline.decode_fixed_s``: 0.15 ms per step plus 28.5 us per layer (small kernels and GEMM floors, cited there);
    in eager mode a step is at least the host's launches (``roofline.eager_step_s``). Tensor-parallel
    all-reduces: the published latencies and bus bandwidths of ``roofline.devices`` (a small-tensor regime and a large one).
    The decode attention is its own kernel after the weight GEMMs (the per-kernel form), reading
    the KV cache at ``attention_bw`` of the peak (None: one roofline over the summed bytes).
    ``calibrate`` replaces them with figures measured on another device.
    """

    model_config = ConfigDict(extra="forbid")
    decode_bw: float = 0.80
    attention_bw: Optional[float] = 0.80
    decode_phi: float = 0.50
    prefill_phi: float = 0.60
    fp8_gemm_share: float = 1.0  # FP8 weights: the decode and prefill FLOP/s shares times this (MAMF FP8 / BF16)
    train_phi: float = 0.40  # the fallback: predict takes roofline.train_mfu's published figure unless measured
    train_phi_measured: bool = False  # calibrated from a profile's training fit
    decode_t0_s: float = rf.GRAPH_STEP_S  # the step's own fixed cost; predictions add the per-layer ones
    decode_t0_includes_layers: bool = False  # calibrated: t0 as measured, per-layer costs inside it
    gemm_floor_s: float = rf.GEMM_FLOOR_S  # a decode weight GEMM's time above its bytes' (per device family)
    host_factor: float = 1.0  # the host's PyTorch dispatch time against an x86 H100 host's (Grace: slower)
    decode_t_seq_s: float = 0.0  # per sequence per decode step (measured only by an overhead probe)
    prefill_t0_s: float = 1.0e-3
    train_t0_s: float = 10e-3
    # collectives: the share of the link's bandwidth nccl-tests' bus bandwidth reaches, the latency
    # of a small collective, and the share of FSDP's collectives hidden under compute by prefetching
    comm_bw: float = 0.80
    tp_alpha_s: float = rf.TP_NVLINK_ALPHA_S  # large tensors (NCCL); PCIe links: rf.TP_PCIE_ALPHA_S
    tp_small_alpha_s: float = rf.TP_SMALL_ALPHA_S  # small tensors on NVLink (custom all-reduce)
    tp_small_bw_share: float = rf.TP_SMALL_BW_SHARE  # their bus bandwidth, as a share of the link's
    fsdp_alpha_s: float = 20e-6
    fsdp_hidden: Optional[float] = None  # None: 1 - roofline.fsdp_exposed_share (published scaling)
    source: str = "stated defaults (no measurement)"
    intervals: dict[str, tuple[Optional[float], Optional[float]]] = {}  # 95% ranges when calibrated
    cautions: list[str] = []  # what a calibration could not carry over as measured, and why

    def describe(self) -> list[str]:
        lines = [f"efficiencies from {self.source}:",
                 f"decode bandwidth {self.decode_bw:.0%} of peak, decode FLOP/s {self.decode_phi:.0%}, "
                 f"prefill FLOP/s {self.prefill_phi:.0%}"
                 + (f" (x {self.fp8_gemm_share:.2f} with FP8 weights)" if self.fp8_gemm_share != 1.0 else "")
                 + ", training FLOP/s "
                 + (f"{self.train_phi:.0%}" if self.train_phi_measured else "the device family's (published FSDP runs)"),
                 "decode attention: " + (f"its own kernel after the GEMMs, KV read at {self.attention_bw:.0%} of "
                                         "peak bandwidth" if self.attention_bw else
                                         "one roofline with the GEMMs over the summed bytes and FLOPs"),
                 f"fixed costs: decode step {self.decode_t0_s * 1e3:.3g} ms"
                 + ("" if self.decode_t0_includes_layers else
                    f" + {(rf.LAYER_KERNELS_S + rf.GEMMS_PER_LAYER * self.gemm_floor_s) * 1e6:.3g} us per layer (small "
                    "kernels and GEMM floors; eager mode adds its launches per layer)")
                 + f", prefill {self.prefill_t0_s * 1e3:.3g} ms, training micro-step {self.train_t0_s * 1e3:.3g} ms"]
        if self.decode_t_seq_s:
            lines.append(f"per-sequence cost of a decode step: {self.decode_t_seq_s * 1e3:.3g} ms")
        lines.append(f"collectives: {self.comm_bw:.0%} of the link bandwidth, latency {self.tp_alpha_s * 1e6:.3g} us "
                     f"(tensor parallel, large; small tensors on NVLink or xGMI {self.tp_small_alpha_s * 1e6:.3g} us at "
                     f"{self.tp_small_bw_share:.0%} of the link; PCIe {rf.TP_PCIE_ALPHA_S * 1e6:.3g} us) and "
                     f"{self.fsdp_alpha_s * 1e6:.3g} us (FSDP), "
                     + (f"{self.fsdp_hidden:.0%} of FSDP's traffic hidden" if self.fsdp_hidden is not None else
                        "FSDP's exposed share from published scaling runs"))
        for k, (lo, hi) in self.intervals.items():
            if lo is not None and hi is not None:
                lines.append(f"{k}: 95% range {lo:.3g} to {hi:.3g}")
        lines += [f"caution: {c}" for c in self.cautions]
        return lines


DEFAULT_EFFICIENCIES = Efficiencies()

# Decode/prefill defaults per device family, resolved from the datasheet row's key (records.peaks).
# One row per family: (family, datasheet keys, engine or None for any, {field: value}, source). Each
# value is a published measurement outside benchmarks/data/published/; a family without one keeps the
# stated defaults and says so. Fields not named keep DEFAULT_EFFICIENCIES' values.
_CDNA3_BW = ("ScalarLM's MI300X memcpy benchmark (scalarlm.ghost.io/blog/scalarlm-benchmarking-mi300x-memcpy): copies "
             "over 10 MB level off at 2.0-3.0 TB/s of 5.3; taken at the top, 3.0 TB/s")
_XGMI = {"tp_small_alpha_s": rf.XGMI_SMALL_ALPHA_S, "tp_small_bw_share": rf.XGMI_SMALL_BW_SHARE,
         "tp_alpha_s": rf.XGMI_ALPHA_S, "comm_bw": rf.XGMI_COMM_BW}
_XGMI_SRC = ("collectives from RCCL's all_reduce_perf on 8 MI300X (rocm.blogs.amd.com, MI300X RCCL xGMI, Mar 2025): "
             "small tensors 7.2 us + 150 GB/s bus bandwidth, large 56 us + 315 GB/s")
_CDNA3_MAF = "FLOP/s shares from AMD's max-achievable FLOPs (rocm.blogs.amd.com, Measuring Max-Achievable FLOPs Part 2): "
# A decode GEMM's floor on CDNA3: ROCm/aiter PR #1092 (MI300X, Sept 2025, tuning Llama 70B/405B GEMMs at TP 1/4/8): FP8
# m=1 n=1280 k=8192 (10.5 MB of weights) in 10.7 us with the tuned pre-shuffled kernel, 17.6 us with the plain CK one;
# its bytes take 3.5 us at the family's 3.0 TB/s, so 7.2 us above them (the tuned kernel's; H100's 4 us).
_CDNA3_GEMM = {"gemm_floor_s": 7.2e-6}
_CDNA3_GEMM_SRC = ("a decode GEMM 7.2 us above its bytes (ROCm/aiter PR #1092, MI300X FP8 m=1 1280x8192: 10.7 us "
                   "tuned, 17.6 us untuned, for 3.5 us of bytes)")
# FP8 GEMMs reach a smaller share of their (twice as high) peak than BF16 ones. Maximum achievable matmul FLOP/s
# (stas00/ml-engineering, compute/accelerator/README.md, MAMF tables, @744d01e Aug 2026; no sparsity, torch 2.5-2.10):
# H100 SXM BF16 794.5 of 989 (80.3%), FP8 1,402.6 of 1,979 (70.9%): 0.883; H200 FP8 1,453.4 (73.4%) against the
# same BF16: 0.914; Hopper 0.90. B200 BF16 1,745 of 2,250 (77.6%), FP8 3,432.5 of 4,500 (76.3%): 0.983; GB200 BF16
# 1,822 of 2,500 (72.9%), FP8 3,615.6 of 5,000 (72.3%): 0.992; Blackwell 0.99. MI300X (AMD's figures above): FP8
# 48.7% against BF16 54.2%: 0.90. The BF16 MAMFs also set Blackwell's FLOP/s shares against Hopper's 80.3%, on
# which the stated shares were set: B200 x 0.776/0.803 = 0.97, GB200 x 0.729/0.803 = 0.91.
_MAMF = "maximum achievable matmul FLOP/s (stas00/ml-engineering MAMF tables, Aug 2026): "
_HOPPER_FP8 = _MAMF + "FP8 at 0.88 (H100) and 0.91 (H200) of BF16's share, 0.90 taken"
_BLACKWELL = (_MAMF + "BF16 {bf16} of peak against H100's 80.3%: x {x:.2f}; FP8 at {fp8:.2f} of BF16's share")
_FLUIDX3D = ("memory bandwidth as FluidX3D's single-GPU benchmark reads it (ProjectPhysX/FluidX3D README, FP32/FP32: "
             "H100 SXM 80%, A100 SXM4 77%, as the Hopper and Ampere rows): ")
_FAMILY_ROWS: list[tuple[str, tuple[str, ...], Optional[str], dict[str, float], str]] = [
    ("NVIDIA Hopper", ("H100 SXM", "H100 PCIe", "H100 NVL", "H200", "H20", "H800 SXM", "H800 PCIe"), None,
     {"decode_bw": 0.80, "fp8_gemm_share": 0.90}, "Nsight Compute on an H100 SXM5 LLM decode "
     "(mikamirai.com/blog/gpu-memory-bandwidth, 2026): weight loads 2.6-2.8 TB/s of 3.35 (78-84%); 80% kept; "
     + _HOPPER_FP8),
    ("NVIDIA Ampere", ("A100 40GB", "A100 80GB PCIe", "A100 80GB SXM", "A800 80GB PCIe", "A800 80GB SXM", "A10",
                       "RTX 3090"), None,
     {"decode_bw": 0.77}, "vLLM batch-1 decode of Llama-3.1-8B BF16 on an A100 40GB, ~75 tokens/s, about 77% of "
     "the memory roofline (johnmusgrave.com/p/vllm-throughput-latency-sweep-on); a read kernel tops out at "
     "1.80 of 2.04 TB/s, 88% (forums.developer.nvidia.com/t/339083)"),
    # Ada: memory bandwidth from FluidX3D's single-GPU table (ProjectPhysX/FluidX3D README at 01d3cdd, column
    # FP32/FP32: a lattice-Boltzmann step streaming 153 bytes a cell, as a share of the datasheet bandwidth), which
    # reads H100 SXM 80% and A100 SXM4 80GB 77%, the Hopper and Ampere rows' decode_bw above, and L40S 67% (L40 69%;
    # in-band ECC on the GDDR6 is on by default), L4 76%, RTX 4090 85%: decode and attention bandwidth at those
    # shares. L40S BF16 matmuls from one table of torch.mm maxima (zzc0721/torch-performance-test-data database.md
    # at 0785868, torch 2.8, square sizes 1,024-10,240): L40S 269.15 of 362 TFLOP/s (74.3%) against H100 789.2 of
    # 989 (79.8%) and H200 790.3 (79.9%): the FLOP/s shares x 0.93. No FP8 GEMM measurement on Ada was found.
    ("NVIDIA Ada", ("L40S",), None,
     {"decode_bw": 0.67, "attention_bw": 0.67, "decode_phi": 0.50 * 0.93, "prefill_phi": 0.60 * 0.93},
     _FLUIDX3D + "L40S 67%; BF16 torch.mm maxima (zzc0721/torch-performance-test-data): L40S 269 of 362 "
     "TFLOP/s, 74.3%, against H100's 79.8%: x 0.93"),
    ("NVIDIA Ada", ("L4",), None, {"decode_bw": 0.76, "attention_bw": 0.76}, _FLUIDX3D + "L4 76%"),
    ("NVIDIA Ada", ("RTX 4090",), None, {"decode_bw": 0.85, "attention_bw": 0.85}, _FLUIDX3D + "RTX 4090 85%"),
    ("NVIDIA Blackwell", ("B200",), None, {"decode_phi": 0.50 * 0.97, "prefill_phi": 0.60 * 0.97, "fp8_gemm_share": 0.98},
     _BLACKWELL.format(bf16="77.6%", x=0.97, fp8=0.98)),
    # GB200's host is a Grace CPU: NVIDIA/TransformerEngine issue #2053 times the CPU side of a torch.nn.Linear
    # forward at 37.08 us on GB200 (33.17 on GH200) against 13.48 us on an H100 DGX (Xeon 8480C): 2.75x, which
    # scales the engine's host-side costs (eager launches, V0's and sync scheduling's host work a decode step).
    # Training passes' host time is not scaled: it is added to the device's (roofline.training.pass_launch_s),
    # where a busy device hides most of a slower host's work; scaled, NeMo-RL's one-step-off GB200 step went
    # from 1.01 to 1.24 of the published.
    ("NVIDIA Blackwell", ("GB200",), None, {"decode_phi": 0.50 * 0.91, "prefill_phi": 0.60 * 0.91,
                                            "fp8_gemm_share": 0.99, "host_factor": 2.75},
     _BLACKWELL.format(bf16="72.9%", x=0.91, fp8=0.99) + "; its Grace host's PyTorch dispatch 2.75x an x86 H100 "
     "host's (TransformerEngine issue #2053: a Linear forward's CPU side 37.08 us against 13.48)"),
    # CDNA3 compute: the datasheet peak is at the 2.1 GHz boost clock, which dense GEMMs do not hold. AMD's
    # max-achievable FLOPs (rocm.blogs.amd.com, "Measuring Max-Achievable FLOPs - Part 2", Feb 2025, hipBLASLt at
    # 4096x4864x32896): MI300X BF16 708 of 1,307 TFLOP/s (54%; FP8 1,273 of 2,615, 49%), MI325X BF16 843 (64.5%;
    # FP8 58%). The stated FLOP/s shares were set on NVIDIA parts, whose dense BF16 GEMMs sustain about 720 of
    # H100's 989 (73%; SemiAnalysis, "MI300X vs H100 vs H200 Benchmark Part 1: Training", Dec 2024): the CDNA3
    # shares are the stated ones x 0.54/0.73 = 0.74 (MI300X) and x 0.645/0.73 = 0.88 (MI325X), BF16's figure.
    ("AMD CDNA3", ("MI300X",), None,
     {"decode_bw": 0.57, "decode_phi": 0.50 * 0.74, "prefill_phi": 0.60 * 0.74, "fp8_gemm_share": 0.90, **_XGMI,
      **_CDNA3_GEMM},
     _CDNA3_BW + "; " + _CDNA3_MAF + "MI300X BF16 708 of 1,307 TFLOP/s, 54%, against about 73% on H100 (SemiAnalysis, "
     "Dec 2024): x 0.74; FP8 1,273 of 2,615, 48.7%: x 0.90 with FP8 weights; " + _XGMI_SRC + "; " + _CDNA3_GEMM_SRC),
    ("AMD CDNA3", ("MI325X",), None,
     {"decode_bw": 0.57, "decode_phi": 0.50 * 0.88, "prefill_phi": 0.60 * 0.88, "fp8_gemm_share": 0.90, **_XGMI,
      **_CDNA3_GEMM},
     _CDNA3_BW + "; " + _CDNA3_MAF + "MI325X BF16 843 of 1,307 TFLOP/s, 64.5%, against about 73% on H100 (SemiAnalysis, "
     "Dec 2024): x 0.88; FP8 58% against 64.5%: x 0.90 with FP8 weights; "
     + _XGMI_SRC + " (the MI300X's, same links); " + _CDNA3_GEMM_SRC + " (the MI300X's, same CUs)"),
]


def family_of(device_key: str) -> Optional[str]:
    """The device family of a datasheet row's key (``peaks.lookup(...).device``), or None."""
    return next((fam for fam, keys, _, _, _ in _FAMILY_ROWS if device_key in keys), None)


def efficiencies_for(device_key: str, engine: Optional[str] = None) -> Efficiencies:
    """Stated defaults for a device: its family's row (the engine's row where one exists), else today's."""
    fam = family_of(device_key)
    rows = [r for r in _FAMILY_ROWS if r[0] == fam and device_key in r[1] and r[2] in (engine, None)]
    if not rows:
        return DEFAULT_EFFICIENCIES.model_copy(update={"source": f"{DEFAULT_EFFICIENCIES.source}; {device_key}: "
                                                       "no device-family row, so the generic defaults"})
    _, _, eng, values, src = max(rows, key=lambda r: r[2] is not None)  # an engine's own row first
    row = f"{fam}{f' ({eng})' if eng else ''} row"
    shown = ", ".join(f"{k} {v * 1e6:.3g} us" if k.endswith("_s") else f"{k} x {v:.3g}" if k == "host_factor"
                      else f"{k} {v:.0%}" for k, v in values.items())
    return DEFAULT_EFFICIENCIES.model_copy(update={**values, "source": f"stated defaults, {row}: {shown} from {src}"})


# ---------------------------------------------------------------- calibration


def _ref_peaks(peaks: Peaks) -> tuple[Optional[float], Optional[float], str]:
    """The peaks a measured profile's efficiencies are relative to: datasheet, else micro-benchmarks."""
    if peaks.datasheet_bytes_per_s and peaks.datasheet_flops_per_s:
        return peaks.datasheet_bytes_per_s, peaks.datasheet_flops_per_s, f"datasheet ({peaks.datasheet_device})"
    return peaks.microbench_bytes_per_s, peaks.microbench_flops_per_s, "the probe's micro-benchmarks"


def calibration_from(profile: Profile) -> Efficiencies:
    """Efficiencies measured on ``profile``'s device: fitted BW and PHI over that device's peaks."""
    if profile.kind == "predicted":
        raise UserError("--calibrate needs a measured profile, not a prediction")
    fit = load_or_fit(profile)
    bw_ref, phi_ref, ref = _ref_peaks(fit.peaks)
    if not bw_ref or not phi_ref:
        raise UserError("--calibrate: that profile has neither datasheet peaks nor micro-benchmarks, so its "
                        "efficiencies are unknown; re-measure it with the hardware probe enabled")
    m = fit.model
    eff = DEFAULT_EFFICIENCIES.model_dump()
    intervals: dict[str, tuple[Optional[float], Optional[float]]] = {}
    cautions: list[str] = []
    if profile.hardware.device_type != "cuda":
        cautions.append(f"calibrated on a {profile.hardware.device_type.upper()} ({profile.hardware.device_name}): its "
                        "kernels' efficiencies need not carry over to a GPU")

    default = DEFAULT_EFFICIENCIES.model_dump()

    def capped(key: str, r: float) -> float:
        if r > 1:  # above what the calibration device's reference can do: not an efficiency
            cautions.append(f"{key}: {r:.0%} of {ref} on the calibration device; capped at 100%")
        return min(r, 1.0)

    def ratio(est_list, name, peak, key, floor_only: bool = False) -> bool:
        """``floor_only``: a FLOP rate that, not identified, is only a floor (every point memory-bound)."""
        for e in est_list:
            if e.name == name:
                if not e.identified and floor_only:  # the data did not pin it: the stated default stays
                    cautions.append(f"{key}: the profile's {name} is not identified, so the default "
                                    f"{default[key]:.0%} stays")
                    eff[key] = default[key]
                    return False
                if not e.identified:
                    cautions.append(f"{key}: the profile's {name} is not identified; carried as fitted, with the "
                                    "fixed cost it was fitted with (the data fix their sum)")
                eff[key] = capped(key, e.value / peak)
                intervals[key] = (min(e.lo / peak, 1.0) if e.lo else None, min(e.hi / peak, 1.0) if e.hi else None)
                return True
        return False

    def fixed(key: str, name: str, value: float) -> None:
        est = next((e for e in fit.generation.params if e.name == name), None)
        if est is not None and "at the bound of its search range" in (est.note or ""):
            cautions.append(f"{key}: the profile's {name} sits at the bound of its search range, so the default "
                            f"{default[key] * 1e3:.3g} ms stays")
            return
        eff[key] = value

    if m.decode and fit.generation:
        ratio(fit.generation.params, "bw_bytes_per_s", bw_ref, "decode_bw")
        ratio(fit.generation.params, "phi_flops_per_s", phi_ref, "decode_phi", floor_only=True)
        eff["attention_bw"] = None  # the measured profile's own form: fitted per kernel, or not
        if ratio(fit.generation.params, "bw_attn_bytes_per_s", bw_ref, "attention_bw"):
            d = m.decode  # the KV reads at their ceiling, as the measured model reads them
            eff["attention_bw"] = capped("attention_bw", rf.kv_read_rate(d.bw_bytes_per_s, d.bw_attn_bytes_per_s,
                                                                         d.bw_mem_bytes_per_s) / bw_ref)
        fixed("decode_t0_s", "t0_s", m.decode.t0_s)
        eff["decode_t0_includes_layers"] = eff["decode_t0_s"] != default["decode_t0_s"]
        eff["decode_t_seq_s"] = m.decode.t_seq_s
        eff["prefill_t0_s"] = m.prefill.t0_s if m.prefill else eff["decode_t0_s"]
        eff["prefill_phi"] = capped("prefill_phi", (m.prefill.phi_flops_per_s if m.prefill
                                                    else m.decode.phi_flops_per_s) / phi_ref)
    if m.train and fit.training:
        eff["train_phi_measured"] = ratio(fit.training.params, "phi_train_flops_per_s", phi_ref, "train_phi",
                                           floor_only=True)
        eff["train_t0_s"] = m.train.t0_s + m.train.optimizer_step_s
    eff["source"] = (f"the fit of a profile of {profile.model.name} on {profile.hardware.device_name} "
                     f"(relative to {ref}; fixed costs carried over as measured there)")
    eff["intervals"] = intervals
    eff["cautions"] = cautions
    return Efficiencies(**eff)
