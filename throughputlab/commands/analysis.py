"""`throughputlab fit`, `predict` and `report`: parse options, call one library function, save, print."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import click

from throughputlab.commands.options import IntList, check_writable
from throughputlab.errors import UserError
from throughputlab.fit.schema import DEFAULT_BOOTSTRAP, DEFAULT_SEED
from throughputlab.settings.options import layer_options


@click.command(context_settings={"show_default": True})
@click.argument("profile", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--bootstrap", type=click.IntRange(min=0), default=DEFAULT_BOOTSTRAP,
              help="Refits on raw samples resampled within each point, for percentile intervals (0: Jacobian intervals only).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the profile with its fit here (default: update PROFILE in place).")
@click.option("--no-save", is_flag=True, help="Print the summary without storing the fit.")
@click.option("--seed", type=int, default=DEFAULT_SEED, help="Seed of the bootstrap.")
def fit(profile: Path, bootstrap: int, output: Optional[Path], no_save: bool, seed: int) -> None:
    """Fit the decode, prefill and training models of a measured profile and store the fit in it.

    Prints the parameters with 95% intervals, the knee concurrency, the largest micro-batch
    that fits, utilisation against the datasheet and the micro-benchmarks, and the
    leave-one-out error at every point. Where the knee lies past the sweep, it ends with the
    `bench --resume` that measures past it.
    """
    from throughputlab.fit import fit_profile, summary_lines
    from throughputlab.records.profile import Profile

    if no_save and output is not None:
        raise UserError("--no-save stores nothing and --output names where to store the fit: give one of them")
    prof = Profile.load(profile)
    target = output or profile
    if not no_save:
        check_writable(target)
    result = fit_profile(prof, bootstrap=bootstrap, seed=seed)
    if not no_save:  # stored before printing: a closed pipe (`fit P | head`) must not lose it
        prof.fit = result.model_dump(mode="json")
        prof.save(target)
    click.echo(f"{prof.model.name} on {prof.hardware.device_name} ({prof.settings.dtype})")
    for line in summary_lines(result):
        click.echo(line)
    more = _past_knee_command(prof, result, profile)
    if more:
        click.echo(f"to measure the compute-bound side instead of extrapolating it: {more}")
    if not no_save:
        click.echo(f"fit stored in {target}")


def _past_knee_command(prof, result, path: Path) -> Optional[str]:
    """The `bench --resume` that adds concurrencies past a fitted decode knee the sweep did not
    reach; None where the knee is inside the sweep, is a range (BW not identified: more
    concurrency does not separate t0 from W/BW), or the sweep was `auto` (it cannot be grown)."""
    from throughputlab.fit.knees import concurrency_past_knee

    g = result.generation
    if g is None or g.knee_range is not None or prof.kind != "measured":
        return None
    if prof.spec is not None and isinstance(prof.spec.generation.concurrency, str):
        return None
    grown = concurrency_past_knee([p.concurrency for p in prof.generation if p.status == "ok"], g.knee_concurrency)
    if grown is None:
        return None
    return f"throughputlab bench --resume -o {shlex.quote(str(path))} -c {','.join(map(str, grown))}"


# flag (click parameter name) -> the predict settings key it sets; the settings model holds the defaults and help
PREDICT_FLAGS = {
    "profile_path": "profile", "model": "model", "gpu": "gpu", "dtype": "dtype", "calibrate": "calibrate",
    "concurrency": "generation.concurrency", "prompt_len": "generation.prompt_len",
    "output_len": "generation.output_len", "micro_batch": "training.micro_batches", "seq_len": "training.seq_len",
    "gpus": "layout.gpus", "tp": "layout.tp", "nodes": "layout.nodes", "train_tp": "layout.train_tp",
    "activation_checkpointing": "layout.activation_checkpointing", "engine": "engine.engine",
    "gpu_memory_utilization": "engine.gpu_memory_utilization", "max_num_seqs": "engine.max_num_seqs",
    "max_model_len": "engine.max_model_len", "kv_cache_gib": "engine.kv_cache_gib",
    "kv_cache_dtype": "engine.kv_cache_dtype", "enforce_eager": "engine.enforce_eager",
    "engine_version": "engine.engine_version", "async_scheduling": "engine.async_scheduling",
    "num_scheduler_steps": "engine.num_scheduler_steps",
    "max_num_batched_tokens": "engine.max_num_batched_tokens", "rope_scaling": "engine.rope_scaling",
    "in_process_logprobs": "engine.in_process_logprobs",
    "distributed_executor_backend": "engine.distributed_executor_backend",
}


def predict_option(*decls: str, **kw):
    from throughputlab.settings.options import setting_option
    from throughputlab.settings.predict import PredictSpec

    return setting_option(PredictSpec, PREDICT_FLAGS[decls[-1]], *decls, **kw)


@click.command()
@layer_options("predict", "layout.tp=2, --set generation.concurrency=[1,8,64]")
@predict_option("--profile", "profile_path", type=click.Path(dir_okay=False))
@predict_option("--model", "-m", "model")
@predict_option("--gpu", "gpu")
@predict_option("--dtype", "dtype")
@predict_option("--calibrate", "calibrate", type=click.Path(dir_okay=False))
@predict_option("--concurrency", "-c", "concurrency", type=IntList())
@predict_option("--prompt-len", "prompt_len", type=int)
@predict_option("--output-len", "output_len", type=int)
@predict_option("--micro-batch", "-b", "micro_batch", type=IntList())
@predict_option("--seq-len", "seq_len", type=int)
@predict_option("--gpus", "gpus", type=int)
@predict_option("--tp", "tp", type=int)
@predict_option("--nodes", "nodes", type=int)
@predict_option("--train-tp", "train_tp", type=int)
@predict_option("--activation-checkpointing", "activation_checkpointing", is_flag=False, flag_value="full")
@predict_option("--engine", "engine", help="Analytic prediction: the generation engine whose KV rule, caps and "
                "defaults apply (vllm, sglang, trtllm).")
@predict_option("--gpu-memory-utilization", "gpu_memory_utilization", type=float, shown="the engine's",
                help="Analytic prediction: vLLM's gpu_memory_utilization (default 0.9); SGLang's "
                     "mem_fraction_static; TensorRT-LLM's kv_cache_free_gpu_memory_fraction (default 0.9).")
@predict_option("--max-num-seqs", "max_num_seqs", type=int,
                shown="the engine's: vLLM 1024 on 70+ GiB GPUs other than A100, else 256; SGLang from its KV pool; "
                      "TensorRT-LLM 2048",
                help="Analytic prediction: sequences the engine runs at once.")
@predict_option("--max-model-len", "max_model_len", type=int,
                shown="the model's context limit, max_position_embeddings or as --rope-scaling stretches it",
                help="Analytic prediction: the engine's max_model_len.")
@predict_option("--kv-cache-gib", "kv_cache_gib", type=float, shown="the engine's rule",
                help="Analytic prediction: the KV cache memory per GPU the engine logged (vLLM: 'Available KV cache "
                     "memory'), instead of its rule.")
@predict_option("--kv-cache-dtype", "kv_cache_dtype",
                help="Analytic prediction: auto (16-bit activations) or fp8 (half the KV bytes).")
@predict_option("--enforce-eager", "enforce_eager", is_flag=True,
                help="Analytic prediction: no CUDA graphs (a larger fixed cost per decode step).")
@predict_option("--engine-version", "engine_version", shown="the current engines (vLLM V1)",
                help="Analytic prediction: the engine's version, e.g. 0.6.3; vLLM before 0.8 (its V0 engine), or a "
                     "0.8-0.10 one that ran V0 (VLLM_USE_V1=0; written 0.8.4+v0), adds 2.4 ms of host time to every "
                     "decode step.")
@predict_option("--async-scheduling/--no-async-scheduling", "async_scheduling",
                shown="the version's: on from vLLM 0.14 (and for a version not given), off before",
                help="Analytic prediction, vLLM: whether the engine schedules the next step while the GPU runs this "
                     "one; without it every decode step adds 13 us of host time per running sequence.")
@predict_option("--num-scheduler-steps", "num_scheduler_steps", type=int, shown="1",
                help="Analytic prediction, vLLM 0.6-0.7 (V0, with --engine-version): multi-step scheduling, N decode "
                     "steps per host round, so the V0 engine's host time is paid once per N steps.")
@predict_option("--max-num-batched-tokens", "max_num_batched_tokens", type=int,
                shown="the engine's: vLLM 8192 on 70+ GiB GPUs other than A100, else 2048; SGLang 8192; "
                      "TensorRT-LLM 8192",
                help="Analytic prediction: the chunked-prefill token budget per step.")
@predict_option("--rope-scaling", "rope_scaling",
                help="Analytic prediction: TYPE:FACTOR (yarn, linear or dynamic), as the engine's --hf-overrides "
                     "rope_scaling: the context limit becomes max_position_embeddings x FACTOR, e.g. yarn:4 for "
                     "Qwen's 128K contexts.")
@predict_option("--in-process-logprobs", "in_process_logprobs", type=click.Choice(["off", "ids", "text"]),
                help="Analytic prediction, vLLM without async scheduling: the engine runs in the caller's process "
                     "and returns each sampled token's log-prob, as RL rollouts ask: ids (no text: veRL's "
                     "synchronous rollout) or text (detokenized: NeMo-RL's synchronous engine), 1.55x or 2.66x the "
                     "host time per running sequence (roofline.engine.LOGPROBS_HOST_RATIO); off for a server or no "
                     "log-probs.")
@predict_option("--distributed-executor-backend", "distributed_executor_backend",
                type=click.Choice(["mp", "uni", "external_launcher", "ray"]), shown="not stated: the version's default",
                help="Analytic prediction, vLLM: the engine's executor. ray (NeMo-RL and OpenRLHF engines of several "
                     "GPUs) schedules asynchronously only from vLLM 0.21 (RayExecutorV2); before, every decode step "
                     "adds the host time of scheduling per running sequence, as without async scheduling.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the prediction as a profile (kind=predicted) that `report` and `decide` read.")
@click.pass_context
def predict(ctx: click.Context, spec_file: Optional[Path], set_items: tuple[str, ...], print_spec: bool,
            output: Optional[Path], **flags) -> None:
    """Predict tokens/s where nothing was measured: from a fitted profile, or from a config and a datasheet.

    The generation table gives per concurrency the sequences the engine runs at once, the decode step,
    tpot_ms (a served run's time per output token, the other requests' prefills included: what vllm bench
    serve calls TPOT), tokens/s with its 80% band, the prefill and the bound (memory, compute, admission).

    The settings are one tree (`--print-spec` shows it), built in this order, later winning: the
    defaults < --spec FILE < the flags below < --set KEY=VALUE.

    \b
    Examples:
      throughputlab predict --profile prof.json -c 3,96,200
      throughputlab predict --model qwen2.5-7b --gpu h200
      throughputlab predict --model qwen2.5-7b --gpu h200 --calibrate a100-profile.json -o h200.json
      throughputlab predict --model qwen2.5-72b --gpu h100 --tp 2 -c 1,8,64
      throughputlab predict --model llama3.1-70b --gpu h100 --dtype fp8 --engine trtllm --kv-cache-dtype fp8
      throughputlab predict --model qwen3-30b-a3b --gpu h200 --gpus 8
      throughputlab predict --model qwen2.5-7b --gpu h200 --set layout.tp=2 --print-spec > h200.yaml
    """
    from throughputlab.settings import Settings
    from throughputlab.settings.options import command_layers, given
    from throughputlab.settings.options import print_spec as echo_spec
    from throughputlab.settings.predict import PredictSpec

    layers = command_layers(ctx, spec_file, "predict", given(ctx, flags), PREDICT_FLAGS, set_items)
    spec = Settings(PredictSpec, "predict").resolve(layers)
    if print_spec:
        echo_spec(spec)
        return
    g, t, lay = spec.generation, spec.training, spec.layout
    _predict(_path(spec.profile), spec.model, spec.gpu, spec.dtype, _path(spec.calibrate), g.concurrency, g.prompt_len,
             g.output_len, t.micro_batches, t.seq_len, lay.gpus, lay.tp, lay.nodes, lay.activation_checkpointing,
             spec.engine, output, lay.train_tp)


def _path(p: Optional[str]) -> Optional[Path]:
    return None if p is None else Path(p)


def _predict(profile_path, model, gpu, dtype, calibrate, concurrency, prompt_len, output_len, micro_batch, seq_len,
             gpus, tp, nodes, activation_checkpointing, opts, output, train_tp: int = 1) -> None:
    from throughputlab.fit.schema import load_fit, micro_batch_statement
    from throughputlab.predict import Layout, generation_table, predict_analytic, predict_from_profile, training_table
    from throughputlab.records.profile import Profile
    from throughputlab.roofline import single_stream_bound

    if (profile_path is None) == (model is None):
        raise UserError("give either --profile PROFILE (fitted prediction) or --model MODEL --gpu GPU (analytic)")
    if output is not None:
        check_writable(output)
    cs = concurrency or [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    bs = micro_batch or [1, 2, 4, 8, 16]
    if profile_path is not None:
        if gpu or calibrate or gpus is not None or (tp, nodes, train_tp) != (1, 1, 1) or activation_checkpointing \
                or opts.given:
            raise UserError("--gpu, --calibrate, --gpus, --tp, --train-tp, --nodes, --activation-checkpointing and the "
                            "engine flags go with --model (analytic prediction), not with --profile")
        pred = predict_from_profile(Profile.load(profile_path), concurrency=cs, prompt_len=prompt_len,
                                    output_len=output_len, micro_batches=bs, seq_len=seq_len)
    else:
        if not gpu:
            raise UserError("--model needs --gpu (a device with a datasheet row, e.g. h200)")
        from throughputlab.models import resolve_model

        spec = resolve_model(model, random_weights=True).spec  # the config is all an analytic prediction reads
        layout = Layout(gpus=tp * nodes if gpus is None else gpus, tp=tp, nodes=nodes, train_tp=train_tp,
                        activation_checkpointing=activation_checkpointing or False).check()
        cal = Profile.load(calibrate) if calibrate else None
        pred = predict_analytic(spec, gpu, dtype=dtype, calibrate=cal, concurrency=cs, prompt_len=prompt_len or 512,
                                output_len=output_len or 512, micro_batches=bs, seq_len=seq_len or 2048, layout=layout,
                                engine=opts)
    fit = load_fit(pred)
    m = fit.model
    st = pred.settings
    click.echo(f"{pred.model.name} on {pred.hardware.device_name} ({st.dtype}), {fit.method} model")
    for a in fit.assumptions:
        click.echo(f"  {a}")
    if m.decode is not None and m.kv_cache_tokens is not None and m.kv_cache_tokens <= 0:
        click.echo(f"generation: none; the weights leave no KV cache on one engine of TP {m.tp} at this memory share "
                   "(give --tp, a smaller --dtype, --gpu-memory-utilization or a larger device)")
    elif m.decode is not None:
        engines = m.train_devices // m.tp if m.train_devices > 1 else 1
        where = (f", per engine of TP {m.tp} ({engines} engine(s) on {m.train_devices} GPUs: multiply tokens/s "
                 f"by {engines} for all of them)" if m.tp > 1 or engines > 1 else "")
        click.echo(f"generation, prompt {st.prompt_len}, output {st.output_len}{where}:")
        click.echo(generation_table(m, cs, st.prompt_len, st.output_len).to_string(index=False, float_format=_num))
        if fit.generation is not None:
            click.echo(fit.generation.knee_note)
            if fit.generation.generation_knee_note:
                click.echo(fit.generation.generation_knee_note)
        k0 = m.short_context_knee()
        click.echo("knee as the context goes to 0: " + (f"{k0:.4g}" if k0 is not None else "none (memory-bound)"))
        if fit.peaks.datasheet_bytes_per_s:
            click.echo(f"single-sequence bound, datasheet bandwidth / weight bytes: "
                       f"{single_stream_bound(m.device_costs, fit.peaks.datasheet_bytes_per_s):,.1f} tokens/s")
        if m.engine is None and m.kv_cache_tokens is not None:
            click.echo(f"KV cache: {m.kv_cache_tokens:,} tokens "
                       f"({m.kv_sequences(st.prompt_len, st.output_len):,} sequences of this length)")
    if m.train is not None:
        from throughputlab import roofline as rf

        ac = rf.checkpointing_mode(m.activation_checkpointing)
        fsdp = ((f", micro-batch per TP group of {m.train_tp} GPUs (tokens/s per GPU), FSDP x TP over {m.train_devices}"
                 if m.train_tp > 1 else f", micro-batch per device, FSDP over {m.train_devices}") + " GPUs"
                + (f" ({1 - m.comm.fsdp_hidden_share:.0%} of its traffic exposed "
                   + ("across nodes" if m.nodes > 1 else "within a node") + ")" if m.comm else "")
                if m.train_devices > 1 else "")
        mfu = ""
        if fit.peaks.datasheet_flops_per_s and fit.method in ("analytic", "calibrated"):
            mfu = f", MFU {m.train.phi_flops_per_s / fit.peaks.datasheet_flops_per_s:.0%}"
            if fit.method == "analytic":
                from throughputlab.calibration import DEFAULT_EFFICIENCIES
                from throughputlab.predict import train_mfu

                mfu += f" ({train_mfu(pred.hardware.device_name, st.dtype, DEFAULT_EFFICIENCIES, m.costs)[1]})"
        click.echo(f"training, sequence length {st.seq_len}{fsdp}, activation checkpointing {ac}{mfu}:")
        click.echo(training_table(m, bs, st.seq_len).to_string(index=False, float_format=_num))
        click.echo(micro_batch_statement(fit))
    if output is not None:
        pred.save(output)
        click.echo(f"prediction written to {output}")


@click.command()
@click.argument("profiles", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=Path("report.html"),
              show_default=True, help="HTML file to write (one file, works offline).")
@click.option("--title", default=None, help="Page title (default: the profiles' labels).")
def report(profiles: tuple[Path, ...], output: Path, title: Optional[str]) -> None:
    """One offline HTML report of one or more profiles (overlaid: two GPUs, two models, vllm against hf)."""
    from throughputlab.records.profile import Profile
    from throughputlab.report.profile_report import render_report, tell_apart

    check_writable(output, "--output")
    loaded = tell_apart([Profile.load(p) for p in profiles], profiles)
    html = render_report(loaded, title=title)
    try:
        output.write_text(html, encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot write report {output}: {e.strerror or e}; choose another --output") from None
    click.echo(f"report written to {output} ({len(html) / 1e6:.1f} MB)")


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.4g}"
