"""Helpers shared by the plot scripts (plot_recall.py, plot_decode.py): the
headless matplotlib import, reading a benchmark's JSON (each failing with a
one-line message that says what to do), and writing the PNG atomically."""
import json
import os
import sys


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


def save_png(fig, path):
    """Lays `fig` out and writes it to `path` as a PNG: a temporary file, then a rename."""
    fig.tight_layout()
    tmp = path + ".tmp"
    fig.savefig(tmp, format="png", dpi=120)
    os.replace(tmp, path)
