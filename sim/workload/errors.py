"""The one error type of the workload package."""

from __future__ import annotations


class WorkloadError(ValueError):
    """A workload that cannot be built: bad trace line, bad option, bad file.

    Messages about a file start with ``FILE:LINE:`` (a Parquet file counts rows
    from 1 as lines), so an editor can jump to the offending record.
    """
