"""Argument checks the compat modules share: errors that name the engine's argument."""


def check_rank(op, name, array, rank, layout):
    """The shape of `array`, which must be an array of `rank` dimensions (`layout` names
    them in the error)."""
    shape = getattr(array, "shape", None)
    if shape is None:
        raise TypeError(f"{op}: {name}: expected an array {layout}, got {type(array).__name__}")
    if len(shape) != rank:
        raise ValueError(f"{op}: {name}: expected {layout}, got shape {tuple(shape)}")
    return tuple(shape)
