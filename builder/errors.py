"""The one error type the CLI turns into a single stderr line and a non-zero exit."""


class BuildError(Exception):
    """A build that cannot proceed; the message is one line meant for the user."""
