"""moe_backend: Mixture-of-Experts dispatch/combine over NVSHMEM, with a PyTorch reference.

See docs/CONTRACT.md for the exact semantics every backend implements.
"""

from .communicator import CombineReceiver, Communicator, DispatchReceiver, RoundError
from .padded import PaddedDispatchResult, PaddedHandle
from .result import DispatchResult, Handle
from .spec import FP8, CommSpec, parse_dtype

__version__ = "0.1.0"

__all__ = [
    "FP8",
    "CombineReceiver",
    "CommSpec",
    "Communicator",
    "DispatchReceiver",
    "DispatchResult",
    "Handle",
    "PaddedDispatchResult",
    "PaddedHandle",
    "RoundError",
    "parse_dtype",
]
