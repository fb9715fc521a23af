"""The ``rocwheels`` command: ``python -m pipeline`` and the installed script."""

import signal


def main() -> None:
    # Held back until the policy is in place: the command line takes a quarter of a second to
    # import, and Python's own Ctrl-C would print a KeyboardInterrupt traceback from inside it.
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM))
    from pipeline.util.interrupts import exit_at_once_on_signals

    exit_at_once_on_signals()
    from pipeline.cli import main as run_command

    run_command()


if __name__ == "__main__":
    main()
