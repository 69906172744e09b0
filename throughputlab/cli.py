"""The `throughputlab` command: a lazy group, so `--help` never imports torch or vllm.

Each subcommand lives in its own module and is imported only when it runs (or when the
help lists it). Every command parses options, calls one library function, saves, prints.
"""

from __future__ import annotations

import importlib
import logging
import signal
import sys

import click

from throughputlab import __version__
from throughputlab.errors import UserError, clear_stop, request_stop

# name -> "module:attribute"; the modules import only light dependencies at top level.
COMMANDS = {
    "bench": "throughputlab.commands.bench:bench",
    "hardware": "throughputlab.commands.info:hardware",
    "models": "throughputlab.commands.info:models",
    "export": "throughputlab.commands.info:export",
    "import": "throughputlab.commands.imports:import_group",
    "fit": "throughputlab.commands.analysis:fit",
    "predict": "throughputlab.commands.analysis:predict",
    "report": "throughputlab.commands.analysis:report",
    "decide": "throughputlab.decide.cli:decide",
    "lr": "throughputlab.lr.cli:lr",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str):
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:  # a half-installed optional part must not break --help
            logging.getLogger(__name__).debug("cannot load %s: %s", name, e)
            return _unavailable(name, str(e))

    def resolve_command(self, ctx, args):
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as e:
            import difflib

            if args and args[0] not in COMMANDS:
                close = difflib.get_close_matches(args[0], list(COMMANDS), n=2)
                if close:
                    raise click.UsageError(f"no such command {args[0]!r}; did you mean {' or '.join(close)}?") from None
            raise e


def _unavailable(name: str, why: str) -> click.Command:
    @click.command(name=name, help=f"(unavailable: {why})", context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def cmd(args):
        raise UserError(f"`throughputlab {name}` cannot load: {why}")

    return cmd


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="throughputlab")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """Measure RL rollout and training throughput, fit the roofline, decide the batch size.

    \b
    Typical use:
      throughputlab bench --model qwen2.5-1.5b -o prof.json   # measure (random weights)
      throughputlab fit prof.json                              # fit the roofline model
      throughputlab report prof.json -o report.html            # one offline HTML file
      throughputlab decide --profile prof.json ...             # which RL batch is fastest
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    handler = logging.StreamHandler()
    handler.setFormatter(_Formatter(with_names=verbose > 0))
    logging.basicConfig(level=level, handlers=[handler])


class _Formatter(logging.Formatter):
    """'warning: ...' as the rest of the output words it; with -v, the module's name as well."""

    def __init__(self, with_names: bool) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s" if with_names else "%(levelname)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record = logging.makeLogRecord(record.__dict__)  # a copy: other handlers see the record as it was
        record.levelname = record.levelname.lower()
        return super().format(record)


def _terminate_as_interrupt(signum, frame) -> None:
    """SIGTERM (``kill PID``, a scheduler's stop) takes Ctrl-C's path: the engine and its processes
    are shut down and every finished point is saved. A second SIGTERM during that shutdown is
    ignored; SIGKILL still ends the process at once."""
    global _terminated
    _terminated = True
    request_stop()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def _interrupt(signum, frame) -> None:
    """Ctrl-C: Python's own KeyboardInterrupt, noted first (errors.request_stop), so that an engine whose
    processes stopped on it too cannot turn it into a failed point."""
    request_stop()
    raise KeyboardInterrupt


_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click 8.2+: a group given no command
_terminated = False  # the interrupt came from SIGTERM: exit 143 (128 + 15), as a process killed by it would


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors become one line on stderr and exit code 2."""
    clear_stop()
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where the caller ignores Ctrl-C
        signal.signal(signal.SIGINT, _interrupt)
    try:
        cli.main(args=argv, prog_name="throughputlab", standalone_mode=False)
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(_interrupted_code())
    except _NO_ARGS_IS_HELP as e:  # `throughputlab` (or a group) alone: its help, as asked
        click.echo(e.ctx.get_help() if e.ctx is not None else e.format_message())
        sys.exit(0)
    except click.UsageError as e:  # one line, not click's usage block
        where = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
        click.echo(f"error: {e.format_message()}{where}", err=True)
        sys.exit(2)
    except click.ClickException as e:
        click.echo(f"error: {e.format_message()}", err=True)
        sys.exit(2 if e.exit_code in (1, 2) else e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted: every finished point is saved; re-run with --resume to finish", err=True)
        sys.exit(_interrupted_code())
    except SystemExit as e:
        sys.exit(_interrupted_code() if e.code == 130 else e.code)
    sys.exit(0)


def _interrupted_code() -> int:
    return 143 if _terminated else 130
