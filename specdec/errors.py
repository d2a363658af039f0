"""The one exception type for errors a user can cause."""


class SpecdecError(Exception):
    """A user-facing error: bad flag, missing model, mismatched tokenizers, too-long prompt.

    The message says what went wrong and what to do. The CLI prints it without a traceback.
    """
