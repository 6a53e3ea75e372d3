"""The rules that keep a user's files safe and every run bounded (docs/robustness.md).

One place for each rule, so that every reader and writer follows the same one:

- `open_regular` / `read_bounded` / `read_head`: an input is opened without blocking
  (a FIFO or a device never hangs us), refused unless it is a regular file, and read up to
  a limit that a real input of its kind stays under.
- `inflate_bounded` / `inflate_stream`: gzip is inflated in chunks and refused when it passes
  its limit, so a small gzip bomb costs the limit, not the bomb's size.
- `guard_outputs` / `write_atomically`: no output is written onto an input (same path,
  symlink, hard link) or inside an input directory, and a file is written under a temporary
  name in its own folder and renamed into place, so a failure leaves no half-written file.
- `regex_problem` / `regex_hits`: every regex a ledger or a flag holds is compiled and run by
  polars (Rust's `regex` crate, linear time in the text), never by Python's backtracking `re`.
- `finite_number` and the click callbacks: numeric options and parameters are finite and in
  range before any work starts.
"""

from __future__ import annotations

import errno
import math
import os
import stat
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import click
import polars as pl

from nsys_ledger.errors import InputError

__all__ = [
    "MAX_LEDGER_BYTES", "MAX_JSON_BYTES", "MAX_INFLATE_RATIO", "MIN_INFLATE_LIMIT", "MAX_BATCH", "MAX_GAP_US",
    "file_kind", "open_regular", "read_bounded", "read_head", "read_chunks", "inflate_bounded", "inflate_stream",
    "guard_outputs",
    "write_atomically", "regex_problem", "regex_hits", "finite_number", "gap_us_option", "regex_option",
]

# A ledger is a page of TOML; the largest we ship is 12 kB.
MAX_LEDGER_BYTES = 4 * 1024 * 1024
# A Kineto trace of a few decode steps is tens of MB; a long capture a few GB.
MAX_JSON_BYTES = 8 * 1024 ** 3
# Real profiler JSON compresses 8-20x; a gzip that inflates more than this is not a trace.
MAX_INFLATE_RATIO = 100
# ... but a tiny gzip may still inflate to a few MB legitimately.
MIN_INFLATE_LIMIT = 64 * 1024 * 1024
_INFLATE_CHUNK = 1024 * 1024

# Requests per decode step: far above any GPU's batch, far below float trouble.
MAX_BATCH = 1_000_000
# A gap threshold of more than 1000 s is no threshold.
MAX_GAP_US = 1e9


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str | os.PathLike[str], shown: str, error: type[InputError] = InputError) -> int:
    """A read-only descriptor of `path`, which must be a regular file (symlinks followed).

    O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer,
    and fstat of the open descriptor then refuses it (no window between check and open)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(shown, "no such file") from None
    except PermissionError:
        raise error(shown, "permission denied") from None
    except IsADirectoryError:
        raise error(shown, "is a directory") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise error(shown, "symlink loop") from None
        raise error(shown, f"cannot open the file ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(shown, f"is {file_kind(mode)}, not a regular file")
    os.set_blocking(fd, True)
    return fd


def read_head(path: str | os.PathLike[str], shown: str, size: int, error: type[InputError] = InputError) -> bytes:
    """The first `size` bytes of the regular file `path`."""
    fd = open_regular(path, shown, error)
    try:
        return os.read(fd, size)
    except OSError as exc:
        raise error(shown, f"cannot read the file ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def read_bounded(path: str | os.PathLike[str], shown: str, limit: int, what: str,
                 error: type[InputError] = InputError) -> bytes:
    """The whole regular file `path`, refused when it holds more than `limit` bytes."""
    fd = open_regular(path, shown, error)
    try:
        with os.fdopen(fd, "rb", closefd=True) as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise error(shown, f"cannot read the file ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise error(shown, f"larger than {_size(limit)}: too large for {what}")
    return data


def read_chunks(path: str | os.PathLike[str], shown: str, limit: int, what: str, size: int,
                error: type[InputError] = InputError) -> tuple[int, Iterator[bytes]]:
    """The size of the regular file `path` and its bytes as pieces of `size` bytes, refused
    (before any piece) when it holds more than `limit` bytes, like `read_bounded`; and refused
    again if it grows past the limit while it is read."""
    fd = open_regular(path, shown, error)
    length = os.fstat(fd).st_size
    if length > limit:
        os.close(fd)
        raise error(shown, f"larger than {_size(limit)}: too large for {what}")

    fh = os.fdopen(fd, "rb", closefd=True)  # closed when the pieces are spent or dropped

    def pieces() -> Iterator[bytes]:
        total = 0
        with fh:
            while True:
                try:
                    piece = fh.read(size)
                except OSError as exc:
                    raise error(shown, f"cannot read the file ({exc.strerror or exc})") from None
                if not piece:
                    return
                total += len(piece)
                if total > limit:
                    raise error(shown, f"larger than {_size(limit)}: too large for {what}")
                yield piece

    return length, pieces()


def inflate_bounded(compressed: bytes, shown: str, limit: int, error: type[InputError] = InputError) -> bytes:
    """Un-gzip `compressed` (all members), refused as soon as the output passes `limit`."""
    return b"".join(inflate_stream([compressed], len(compressed), shown, limit, error))


def inflate_stream(compressed: Iterable[bytes], compressed_size: int, shown: str, limit: int,
                   error: type[InputError] = InputError) -> Iterator[bytes]:
    """Un-gzip the pieces of `compressed` (all members) as a stream of inflated pieces of at
    most 1 MiB, refused as soon as the output passes `limit` (so a trace larger than memory
    can be read piece by piece, and a gzip bomb still costs only the limit)."""
    total = 0
    inflater = zlib.decompressobj(wbits=31)
    started = False  # a member has begun: its end must come before the input does
    for data in compressed:
        while data or started:
            if not started:
                data = data.lstrip(b"\x00")  # gzip allows members back to back, padded with zeros
                if not data:
                    break
                inflater, started = zlib.decompressobj(wbits=31), True
            try:
                piece = inflater.decompress(data, _INFLATE_CHUNK)
            except zlib.error as exc:
                raise error(shown, f"corrupt gzip data ({exc})") from None
            total += len(piece)
            if total > limit:
                raise error(shown, f"gzip data inflates to more than {_size(limit)} "
                                   f"({_size(compressed_size)} compressed): not a profiler trace")
            if piece:
                yield piece
            if inflater.eof:
                data, started = inflater.unused_data, False
                continue
            data = inflater.unconsumed_tail
            if not data and len(piece) < _INFLATE_CHUNK:
                break  # this piece of input is spent and no output is pending: wait for the next
    if started:
        raise error(shown, "truncated gzip file (incomplete copy or download?)")


def inflate_limit(compressed_size: int) -> int:
    return min(MAX_JSON_BYTES, max(MIN_INFLATE_LIMIT, MAX_INFLATE_RATIO * compressed_size))


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


# --------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _inputs_of(inputs: Iterable[str | os.PathLike[str] | None]) -> list[tuple[str, str]]:
    """(shown, real path) of every input; a glob pattern stands for the files it matches."""
    import glob

    found = []
    for given in inputs:
        if given is None:
            continue
        text = str(given)
        names = [text] if os.path.lexists(text) else glob.glob(text) or [text]
        for name in names:
            real = os.path.realpath(name)
            # the files SQLite keeps beside a database, and the export cache beside a report
            found += [(name, real), *((name, real + side) for side in _SIDE_FILES)]
    return found


_SIDE_FILES = ("-wal", "-shm", "-journal", ".nsys-ledger-cache")


def guard_outputs(outputs: Sequence[tuple[str, str]], inputs: Iterable[str | os.PathLike[str] | None]) -> list[Path]:
    """Check each (option, path) output before any work; raise InputError naming it when
    it cannot be written or would be written onto or inside an input.

    An output that is an input, a symlink or hard link to one, or a path inside an input
    directory (a parquetdir, a report's export cache) is refused; so are two outputs on the
    same file. Returns the paths as given."""
    sources = [(shown, real, _identity(real)) for shown, real in _inputs_of(inputs)]
    claimed: dict[str, str] = {}
    targets = []
    for option, path in outputs:
        target = _writable(path)
        real = os.path.realpath(path)
        identity = _identity(real)  # a hard link has its own path but the input's inode
        for shown, source, source_identity in sources:
            if real == source or (identity is not None and identity == source_identity):
                raise InputError(path, f"cannot write output ({option}): it is the input {shown}")
            if os.path.isdir(source) and real.startswith(source.rstrip(os.sep) + os.sep):
                raise InputError(path, f"cannot write output ({option}): it is inside the input directory {shown}")
        if real in claimed:
            raise InputError(path, f"cannot write output ({option}): {claimed[real]} writes the same file")
        claimed[real] = option
        targets.append(target)
    return targets


def _writable(path: str) -> Path:
    """Fail early (before the work) when an output file cannot be written."""
    target = Path(path)
    if target.is_dir():
        raise InputError(path, "cannot write output: is a directory")
    if target.exists():
        mode = target.stat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
            raise InputError(path, f"cannot write output: is {file_kind(mode)}")
    parent = Path(os.path.realpath(path)).parent
    if not parent.exists():
        raise InputError(path, f"cannot write output: directory {target.parent} does not exist")
    if not parent.is_dir():
        raise InputError(path, f"cannot write output: {target.parent} is not a directory")
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise InputError(path, "cannot write output: permission denied")
    return target


def write_atomically(target: str | os.PathLike[str], write: Callable[[Path], None]) -> None:
    """Run `write(path)` on a temporary file beside `target`, then rename it over `target`.

    A failure (disk full, a bug in a writer) leaves `target` as it was and no temporary
    file. A symlink is written through (the file it names is replaced). A character device
    or a FIFO (`/dev/stdout`, a pipe) is written directly: it cannot be renamed over.
    Raises InputError naming `target` on an OS error."""
    real = os.path.realpath(target)
    try:
        if os.path.exists(real) and not stat.S_ISREG(os.stat(real).st_mode):
            write(Path(real))
            return
        fd, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(real)}.", suffix=".tmp",
                                         dir=os.path.dirname(real))
        os.close(fd)
        try:
            os.chmod(temporary, 0o666 & ~_umask())
            write(Path(temporary))
            os.replace(temporary, real)
        except BaseException:
            with _suppressed(OSError):
                os.unlink(temporary)
            raise
    except OSError as exc:
        raise InputError(target, f"cannot write output: {exc.strerror or exc}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class _suppressed:
    def __init__(self, *kinds: type[BaseException]):
        self.kinds = kinds

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, value, tb) -> bool:
        return kind is not None and issubclass(kind, self.kinds)


# --------------------------------------------------------------------------------------
# Regexes: polars (Rust `regex`), linear time
# --------------------------------------------------------------------------------------

_PROBE = pl.Series("probe", [""], dtype=pl.String)


def regex_problem(pattern: str) -> str | None:
    """Why polars' regex engine cannot run `pattern` (one line), or None when it can."""
    try:
        _PROBE.str.contains(pattern)
    except Exception as exc:  # polars raises ComputeError with the regex crate's message
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = next((line for line in lines if line.startswith("error:")), lines[-1] if lines else "")
        return f"invalid regex ({detail or type(exc).__name__})"
    return None


def regex_hits(patterns: Sequence[str], texts: Sequence[str]) -> list[list[bool]]:
    """hits[p][t]: pattern p found in text t (search, not full match), all by polars."""
    series = pl.Series("text", list(texts), dtype=pl.String)
    return [series.str.contains(pattern).fill_null(False).to_list() for pattern in patterns]


# --------------------------------------------------------------------------------------
# Numbers
# --------------------------------------------------------------------------------------


def finite_number(value: float, what: str, low: float | None = None, high: float | None = None,
                  low_open: bool = False) -> str | None:
    """Why `value` is not a usable number for `what` (one line), or None when it is."""
    if math.isnan(value):
        return f"{what} is NaN, expected a number"
    if math.isinf(value):
        return f"{what} is infinite, expected a finite number"
    if low is not None and (value <= low if low_open else value < low):
        return f"{what} must be {'above' if low_open else 'at least'} {low:g}, got {value:g}"
    if high is not None and value > high:
        return f"{what} must be at most {high:g}, got {value:g}"
    return None


def gap_us_option(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """--gap-us: a finite threshold above 0 and at most 1000 s."""
    if value is None:
        return None
    problem = finite_number(value, "the gap threshold", low=0, high=MAX_GAP_US, low_open=True)
    if problem:
        raise click.BadParameter(problem)
    return value


def regex_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--step-nvtx and other regex flags: refused before the trace is read if polars cannot run it."""
    if value is None:
        return None
    if value == "":
        raise click.BadParameter("an empty regex matches everything")
    problem = regex_problem(value)
    if problem:
        raise click.BadParameter(f"{value!r}: {problem}")
    return value
