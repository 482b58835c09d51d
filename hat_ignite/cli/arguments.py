"""The command-line arguments ``hat-train`` and ``hat-predict`` share, in hat-ignite's and HAT's spelling.

``CONFIG`` or ``-c/--config CONFIG``, ``-s/--stage``, ``--opts``/``--cfg-options`` (``KEY=VALUE``
items and HAT's ``KEY VALUE`` pairs), HAT's ``--opts-overwrite`` and ``--pipeline-test``, the
``hat`` import alias switch, and the environment HAT's tools export before a config runs.
Imports nothing heavy, so ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Sequence

from hat_ignite.config import Config
from hat_ignite.errors import ConfigError

__all__ = ["make_parser", "parse_arguments", "export_hat_environment", "use_hat_alias", "prepare_config_imports"]

logger = logging.getLogger("hat_ignite.cli")

_HAT_FORM = """HAT's command line works too: -c/--config CONFIG, -s/--stage STAGE,
--opts KEY VALUE [KEY VALUE ...] (HAT's pairs, mixed freely with KEY=VALUE items) and
MMEngine's --cfg-options. Configs may import from hat.* (see --no-hat-alias)."""


def _peek(argv: Sequence[str]) -> argparse.Namespace:
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("config", nargs="?")
    peek.add_argument("-c", "--config", dest="config_flag")
    peek.add_argument("--no-hat-alias", action="store_true")
    known, _ = peek.parse_known_args(list(argv))
    return known


def _stages_line(argv: Sequence[str]) -> str:
    """A line listing the stages of the config named in ``argv``, for ``--help``."""
    known = _peek(argv)
    path = known.config_flag or known.config
    if not path:
        return "Stages: give CONFIG before --help to list the stages it defines."
    prepare_config_imports(not known.no_hat_alias)
    try:
        stages = Config.fromfile(path).stages()
    except ConfigError as exc:
        return f"Stages: cannot list them, the config does not load: {exc}"
    listing = "; ".join(f"{name} ({', '.join(keys)})" for name, keys in stages.items()) or "none found"
    return f"Stages in {path}: {listing}."


def make_parser(prog: str, description: str, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The arguments both commands take; ``--help`` lists the stages of the given config.

    The config is read for the stage list only when help is asked for, so a normal run executes
    the config file once. Parse with :func:`parse_arguments`, which settles ``args.config``.
    """
    stages_line = _stages_line(argv) if {"-h", "--help"} & set(argv) else None
    parser = argparse.ArgumentParser(
        prog=prog, description=f"{description}\n\n{_HAT_FORM}", epilog=stages_line,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "config", nargs="?",
        help="path of the .py config file (or give it with -c/--config); it is Python and runs when read, "
             "also for --help and --dry-run: use only configs you trust",
    )
    parser.add_argument(
        "-c", "--config", dest="config_flag", metavar="CONFIG", help="path of the .py config file (HAT's spelling)",
    )
    parser.add_argument(
        "-s", "--stage", default="float",
        help="stage to run: its {stage}_trainer / {stage}_predictor key (default: float)",
    )
    parser.add_argument(
        "--opts", "--cfg-options", dest="opts", nargs="+", action="extend", default=[], metavar="ITEM",
        help="override config values: KEY=VALUE items or HAT's KEY VALUE pairs, e.g. "
        "float_trainer.num_epochs=3 or float_trainer.num_epochs 3; values are Python literals, else strings",
    )
    parser.add_argument(
        "--opts-overwrite", type=_true_or_false, default=True, metavar="{True,False}",
        help="HAT's switch: False keeps the config's value where an --opts key already exists (default True)",
    )
    parser.add_argument(
        "--pipeline-test", action="store_true",
        help="export HAT_PIPELINE_TEST=1 for configs that read it, as HAT's tools do",
    )
    parser.add_argument("--work-dir", help="directory for logs, checkpoints and metrics (default: the config's work_dir)")
    parser.add_argument(
        "--no-hat-alias", action="store_true",
        help="do not serve `import hat` / `from hat.* import ...` from hat-ignite (see docs/hat-migration.md); "
        "a real HAT install is always left alone",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug log lines")
    return parser


def parse_arguments(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv``; ``args.config`` is the config given positionally or with ``-c/--config``."""
    args = parser.parse_args(list(argv))
    if args.config and args.config_flag and args.config != args.config_flag:
        parser.error(f"two configs given: {args.config} and -c/--config {args.config_flag}; give one.")
    args.config = args.config or args.config_flag
    if not args.config:
        parser.error("the config is required: give CONFIG or -c/--config CONFIG.")
    return args


def _true_or_false(text: str) -> bool:
    if text not in ("True", "False"):
        raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")
    return text == "True"


def export_hat_environment(args: argparse.Namespace) -> None:
    """Set the variables HAT's tools export before the config runs (configs read them).

    ``HAT_TRAINING_STEP`` and ``HAT_INFERENCE_STEP`` are the stage, ``HAT_PIPELINE_TEST`` is
    ``1`` with ``--pipeline-test`` and ``0`` otherwise.
    """
    os.environ["HAT_TRAINING_STEP"] = os.environ["HAT_INFERENCE_STEP"] = args.stage
    os.environ["HAT_PIPELINE_TEST"] = "1" if args.pipeline_test else "0"


def use_hat_alias(enabled: bool) -> None:
    """Install the ``hat`` import alias (unless disabled) and log which ``hat`` configs get."""
    if not enabled:
        logger.debug("hat.* import alias disabled (--no-hat-alias)")
        return
    from hat_ignite.hat_alias import install_hat_alias

    logger.info("%s", install_hat_alias())


def prepare_config_imports(hat_alias: bool) -> None:
    """What a config's imports need: the ``hat`` alias (unless disabled), then the directory the
    command runs from, last on ``sys.path``.

    A config may import the modules of the directory the command runs from (``import
    my_project.models`` from a project's root) as with ``PYTHONPATH=$PWD``; last, so that an
    installed package of the same name wins, and added after the alias is settled, so that it
    never changes which ``hat`` is used. Processes started with ``spawn`` / ``forkserver`` (DDP
    ranks, DataLoader workers) get this ``sys.path`` and import the same modules.
    :func:`hat_ignite.cli.common.run_main` takes the directory off again when the command ends.
    """
    use_hat_alias(hat_alias)
    try:
        here = os.getcwd()
    except OSError:  # the directory was removed under the command
        return
    if here not in {os.path.abspath(entry) if entry else here for entry in sys.path if isinstance(entry, str)}:
        sys.path.append(here)
