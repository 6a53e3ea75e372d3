"""nsys-ledger: check Nsight Systems traces of LLM inference against a kernel ledger.

    >>> import nsys_ledger
    >>> result = nsys_ledger.check("trace.sqlite", "expectations/glm-5.3-tp8-ep8.toml")
    >>> result.verdict, [f.message for f in result.findings]
"""

__version__ = "0.1.0"

from nsys_ledger.api import Result, check  # noqa: E402
from nsys_ledger.ledger import load_expectations  # noqa: E402
from nsys_ledger.pipeline.multifile import check_many  # noqa: E402
from nsys_ledger.trace import load_trace  # noqa: E402

__all__ = ["Result", "check", "check_many", "load_expectations", "load_trace", "__version__"]
