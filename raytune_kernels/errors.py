"""Errors raised to users. Each names the thing that is wrong and where it came from."""


class RaytuneError(Exception):
    """Base class of every error raised on purpose by raytune-kernels."""


class UnsupportedOpError(RaytuneError):
    """The network uses an operator the frontend cannot capture."""

    def __init__(self, op: str, layer: str, detail: str = ""):
        self.op, self.layer = op, layer
        tail = f": {detail}" if detail else ""
        super().__init__(f"unsupported op '{op}' in layer '{layer}'{tail}")


class DynamicShapeError(RaytuneError):
    """The network's shapes depend on tensor values; only static shapes are tuned."""

    def __init__(self, what: str, layer: str, detail: str = ""):
        self.what, self.layer = what, layer
        tail = f" ({detail})" if detail else ""
        super().__init__(
            f"dynamic shape in layer '{layer}': {what}; raytune-kernels tunes static shapes "
            f"only, specialise the model to fixed input shapes{tail}"
        )


class CaptureError(RaytuneError):
    """Neither torch.fx nor torch.export could capture the network."""


class UnknownTargetError(RaytuneError, ValueError):
    """A target string that names no backend we have."""


class UnknownModelError(RaytuneError, ValueError):
    """A model name that is neither a zoo entry nor a `file.py:factory` spec."""


class CompileError(RaytuneError):
    """The network cannot be compiled as asked (names the task, layer or value)."""


class TuneError(RaytuneError):
    """Tuning could not start (bad address, unwritable records, unsupported target, a count
    that is not a positive integer), or stopped for the machine's sake."""
