"""Helpers shared by the plot scripts (plot_recall.py, plot_decode.py): the
headless matplotlib import, reading a benchmark's JSON (each failing with a
one-line message that says what to do), and writing the PNG atomically."""
import io
import json
import os
import sys
import tempfile


def pyplot(prog):
    """matplotlib.pyplot on the Agg backend (no display), or exit naming the package."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        sys.exit(f"{prog}: matplotlib is missing ({e}); install python3-matplotlib")
    return plt


def load_results(prog, path, *keys):
    """The JSON document at `path` and its top-level `keys`, or exit saying why not."""
    try:
        with open(path) as f:
            res = json.load(f)
        return [res[k] for k in keys]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"{prog}: cannot read results from {path}: {e}")


def open_atomic(path):
    """A uniquely named temporary beside `path` (mkstemp: O_EXCL, never a symlink
    or a file already there), as (file object, temporary path). Write, then
    commit_atomic; on failure remove the temporary, never anything else."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".")
    return os.fdopen(fd, "wb"), tmp


def commit_atomic(f, tmp, path):
    """Syncs and renames the temporary over `path` (0666 less the umask)."""
    f.flush()
    os.fsync(f.fileno())
    mask = os.umask(0)
    os.umask(mask)
    os.fchmod(f.fileno(), 0o666 & ~mask)
    f.close()
    os.replace(tmp, path)


def write_atomic(path, data):
    """Writes `data` (bytes or str) to `path` through a unique temporary and a rename."""
    f, tmp = open_atomic(path)
    try:
        f.write(data.encode() if isinstance(data, str) else data)
        commit_atomic(f, tmp, path)
    except BaseException:
        f.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_png(fig, path):
    """Lays `fig` out and writes it to `path` as a PNG through write_atomic."""
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    write_atomic(path, buf.getvalue())
