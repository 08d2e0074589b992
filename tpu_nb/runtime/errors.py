"""The one exception type user mistakes raise, so layers above can show it as one line."""


class TpuNbError(Exception):
    """A mistake the user can fix: the message says what is wrong and the exact fix."""
