"""The one exception type for problems a user can fix."""


class ChargenError(Exception):
    """A user-facing problem: the message names what is wrong and what to do.

    Library code raises it; only the edges (the CLI, the app) turn it into output.
    """
