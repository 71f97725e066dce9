"""The error types the CLI turns into a single stderr line and a non-zero exit."""


class BuildError(Exception):
    """A build that cannot proceed (exit 1); the message is one line meant for the user."""


class UsageError(BuildError):
    """The command line or spec file is wrong in itself, whatever the model (exit 2, like argparse's errors)."""
