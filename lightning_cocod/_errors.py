"""How the package quotes an exception in its one-line errors. Standard library only, so the app
can use it before (or without) loading torch."""


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
