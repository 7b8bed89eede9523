"""fasteagle: FastEagle cascaded drafting for lossless speculative decoding."""

from fasteagle.errors import FastEagleError

__all__ = ["FastEagleError"]
__version__ = "0.1.0"
