"""What `throughputlab bench` prints: the progress bar and the tables at the end."""

from __future__ import annotations


class RichHooks:
    """A rich progress bar: current point and the last point's tokens/s."""

    def __init__(self, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = console
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[last]}"), console=console,
                                 transient=False)
        self.task = None

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def sweep_started(self, kind, total):
        self.task = self.progress.add_task(kind, total=total, last="")
        self.length = ""  # the sweep's prompt or sequence length, once a point has said it (a grid runs several)

    def point_started(self, kind, x):
        label = "concurrency" if kind == "generation" else "micro-batch"
        self.progress.update(self.task, description=f"{kind}{self.length}: {label} {x}")

    def point_finished(self, point, resumed=False):
        prompt = getattr(point, "prompt_len", None)
        self.length = f", prompt {prompt}" if prompt else f", seq {point.seq_len}"
        x = getattr(point, "concurrency", None) or getattr(point, "micro_batch", None)
        tps = point.tokens_per_s
        tag = " (resumed)" if resumed else ""
        last = f"{x}: {tps:,.0f} tok/s{tag}" if tps else f"{x}: {point.status}{tag}"
        self.progress.update(self.task, advance=1, last=last)

    def sweep_finished(self, kind):
        if self.task is not None:
            t = self.progress.tasks[self.task]
            self.progress.update(self.task, total=t.completed, description=f"{kind}{self.length}: done")


def print_summary(console, profile) -> None:
    from rich.table import Table

    if profile.generation:
        prompts = sorted({p.prompt_len for p in profile.generation})
        replicas = max(p.parallel.dp for p in profile.generation)
        shown = f"prompt {prompts[0]}" if len(prompts) == 1 else "prompts " + ",".join(map(str, prompts))
        t = Table(title=f"generation ({profile.settings.gen_backend}, {shown}, output {profile.settings.output_len})")
        cols = ["concurrency", "status", "tokens/s", "decode step ms", "prefill ms", "cv %", "peak mem GiB"]
        if replicas > 1:  # concurrency and the figures are per replica (the slowest one's)
            cols[0:3] = ["concurrency per replica", "status", "tokens/s slowest replica", f"tokens/s all {replicas}"]
        if len(prompts) > 1:
            cols.insert(0, "prompt")
        for col in cols:
            t.add_column(col, justify="right")
        for p in sorted(profile.generation, key=lambda p: (p.prompt_len, p.concurrency)):
            extra = [_f(p.aggregate_tokens_per_s, "{:,.1f}")] if replicas > 1 else []
            first = [str(p.prompt_len)] if len(prompts) > 1 else []
            t.add_row(*first, str(p.concurrency), p.status, _f(p.tokens_per_s, "{:,.1f}"), *extra,
                      _f(p.decode_step_s, "{:.2f}", 1e3), _f(p.prefill_s, "{:.1f}", 1e3), _f(p.cv, "{:.1f}", 100),
                      _f(p.peak_mem_bytes, "{:.2f}", 2**-30))
        console.print(t)
        for why in sorted({p.error for p in profile.generation if p.status == "skipped" and p.error}):
            console.print(f"skipped: {why}", highlight=False)
    if profile.training:
        seqs = sorted({p.seq_len for p in profile.training})
        shown = f"seq {seqs[0]}" if len(seqs) == 1 else "seq " + ",".join(map(str, seqs))
        t = Table(title=f"training ({profile.settings.train_backend}, {shown})")
        cols = ["micro-batch", "status", "tokens/s", "step ms", "cv %", "peak mem GiB"]
        if len(seqs) > 1:
            cols.insert(0, "seq")
        for col in cols:
            t.add_column(col, justify="right")
        for p in sorted(profile.training, key=lambda p: (p.seq_len, p.micro_batch)):
            first = [str(p.seq_len)] if len(seqs) > 1 else []
            t.add_row(*first, str(p.micro_batch), p.status, _f(p.tokens_per_s, "{:,.1f}"), _f(p.step_s, "{:.1f}", 1e3),
                      _f(p.cv, "{:.1f}", 100), _f(p.peak_mem_bytes, "{:.2f}", 2**-30))
        console.print(t)
        for why in sorted({p.error for p in profile.training if p.status == "skipped" and p.error}):
            console.print(f"skipped: {why}", highlight=False)
        from throughputlab.fit.schema import memory_statement
        from throughputlab.fit.training import fit_memory
        from throughputlab.sweep import largest_fitting

        mem = fit_memory(profile)  # the same statement `fit` and `report` print
        if mem is not None and mem.activation_form is not None:  # a line per measured sequence length
            for seq in seqs:
                console.print(memory_statement(mem, seq))
        elif mem is not None:
            console.print(memory_statement(mem))
        elif largest_fitting(profile.training) is not None:
            console.print(f"largest micro-batch that fits: {largest_fitting(profile.training)} measured "
                          "(larger ones ran out of memory; too few points for a memory line)")
    single = [p for p in profile.generation + profile.training if p.status == "ok" and len(p.samples) == 1]
    if single:
        console.print(f"note: {len(single)} point(s) have one sample, so their spread (cv) is unknown and a noisy "
                      "one was not measured again; use --repeats 2 or more --rounds (`--resume --rounds 3` "
                      "adds them)", highlight=False)


def print_ranks(console, ranks) -> None:
    """Per rank of each training point: the shards' bytes as measured on the rank, peak memory, and
    the communication no compute overlapped."""
    from rich.table import Table

    t = Table(title=f"per rank ({ranks.world_size} ranks)",
              caption="exposed comm: the collectives' time no compute overlapped (torch.profiler); "
                      "every rank's figures are in PROFILE.ranks.json")
    for col in ("micro-batch", "rank", "seqs", "params MiB", "optim MiB", "grads MiB", "peak GiB",
                "exposed comm ms"):
        t.add_column(col, justify="right")
    for p in ranks.points:
        for r, m in enumerate(p.memory):
            peak = m.peak_allocated_bytes if m.peak_allocated_bytes is not None else m.peak_rss_bytes
            comm = p.comm.exposed_comm_s[r] if p.comm is not None and r < len(p.comm.exposed_comm_s) else None
            t.add_row(str(p.micro_batch), str(r), str(m.micro_batch), _f(m.param_bytes, "{:,.1f}", 2**-20),
                      _f(m.optimizer_state_bytes, "{:,.1f}", 2**-20), _f(m.grad_bytes, "{:,.1f}", 2**-20),
                      _f(peak, "{:.2f}", 2**-30), _f(comm, "{:.1f}", 1e3))
    console.print(t)


def print_scaling(console, profiles) -> None:
    from rich.table import Table

    from throughputlab.distributed.scaling import scaling_rows

    t = Table(title="scaling over world sizes (the same micro-batch per rank)")
    for col in ("per-rank micro-batch", "ranks", "tokens/s", "tokens/s per device", "efficiency"):
        t.add_column(col, justify="right")
    for r in scaling_rows(profiles):
        t.add_row(str(r.per_rank), str(r.world_size), f"{r.tokens_per_s:,.1f}", f"{r.tokens_per_s_per_device:,.1f}",
                  "-" if r.efficiency is None else f"{100 * r.efficiency:.0f}%")
    console.print(t)


def _f(x, fmt: str, scale: float = 1.0) -> str:
    return "-" if x is None else fmt.format(x * scale)
