"""Error type raised for malformed EXL3 tensors."""


class Exl3FormatError(ValueError):
    """An EXL3 tensor (or set of tensors) does not match the format.

    The message names the offending tensor whenever a name is known.
    """
