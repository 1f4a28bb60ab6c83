"""The two ways a tool call fails, as the daemon reports them (the provider raises its own kinds)."""


class InputError(Exception):
    """The input is not acceptable: a missing field, a path outside the allowed roots, an unknown tool."""


class Failed(Exception):
    """The tool ran and failed; the model sees the message as an error result."""
