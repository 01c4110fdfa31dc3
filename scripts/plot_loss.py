#!/usr/bin/python3
"""Draws loss curves from the CSV files the MPI samples write with --loss-csv (samples/README.md).

  scripts/plot_loss.py --out loss.png --title "linreg, 4 ranks" sync=sync.csv straggler=straggler.csv

Each LABEL=CSV argument is one curve. A CSV has the header `step,loss,seconds` and one row per logged
step, steps increasing. The figure (1200 x 500 px) has two panels that share the loss axis (log scale):
loss against step, and a smaller one of loss against the seconds since the training loop started, where
a straggler shows as a curve stretched to the right. Losses that are not positive (a diverged run's
inf or nan, say) have no place on a log axis and are left out of the lines.

Needs matplotlib (Debian: apt-get install python3-matplotlib). A missing or malformed CSV, or a bad
argument, gets one line on stderr and exit status 2.
"""

import argparse
import csv
import math
import sys

HEADER = ["step", "loss", "seconds"]
WIDTH_PX, HEIGHT_PX, DPI = 1200, 500, 100


def fail(message):
    print(f"plot_loss.py: {message}", file=sys.stderr)
    sys.exit(2)


def read_curve(path):
    """The (steps, losses, seconds) columns of one --loss-csv file; fails on anything else."""
    try:
        with open(path, newline="", encoding="utf-8") as file:
            rows = list(csv.reader(file))
    except (OSError, UnicodeDecodeError) as error:
        fail(f"cannot read {path}: {getattr(error, 'strerror', None) or error}")
    except csv.Error as error:
        fail(f"{path} is not a CSV file: {error}")
    if not rows or [cell.strip() for cell in rows[0]] != HEADER:
        fail(f"{path}: the first line must be '{','.join(HEADER)}' (a --loss-csv file)")
    steps, losses, seconds = [], [], []
    for number, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(HEADER):
            fail(f"{path}: line {number} has {len(row)} fields, not the {len(HEADER)} of '{','.join(HEADER)}'")
        try:
            step, loss, second = int(row[0]), float(row[1]), float(row[2])
        except ValueError:
            fail(f"{path}: line {number} is not a whole step, a loss and seconds: '{','.join(row)}'")
        if steps and step <= steps[-1]:
            fail(f"{path}: line {number}: step {step} does not follow step {steps[-1]} (steps must increase)")
        if not math.isfinite(second) or second < 0:
            fail(f"{path}: line {number}: seconds must be a finite number >= 0, not {row[2]}")
        steps.append(step)
        losses.append(loss)
        seconds.append(second)
    if not steps:
        fail(f"{path} has no rows after its header")
    return steps, losses, seconds


def parse_curve_argument(text):
    label, equals, path = text.partition("=")
    if not equals or not label or not path:
        fail(f"'{text}' is not LABEL=CSV (e.g. straggler=straggler.csv)")
    return label, path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, metavar="PNG", help="the image to write")
    parser.add_argument("--title", required=True, metavar="TEXT", help="the figure's title")
    parser.add_argument("curves", nargs="+", metavar="LABEL=CSV", help="one curve: its legend label and file")
    options = parser.parse_args()

    curves = []
    for argument in options.curves:
        label, path = parse_curve_argument(argument)
        curves.append((label, read_curve(path)))

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError:
        fail("needs matplotlib (Debian: apt-get install python3-matplotlib)")

    figure, (by_step, by_time) = pyplot.subplots(
        1, 2, figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI, sharey=True,
        gridspec_kw={"width_ratios": [2.3, 1]}, layout="constrained")
    figure.suptitle(options.title, fontsize=13)
    for label, (steps, losses, seconds) in curves:
        # Markers show where the points are when there are few of them; dense curves read better without.
        style = {"marker": "o", "markersize": 3} if len(steps) <= 60 else {}
        line, = by_step.plot(steps, losses, linewidth=1.6, label=label, **style)
        by_time.plot(seconds, losses, linewidth=1.3, color=line.get_color(), **style)

    by_step.set_yscale("log", nonpositive="mask")
    by_step.set_xlabel("step")
    by_step.set_ylabel("loss (log scale)")
    by_step.set_title("loss against step", fontsize=11)
    by_step.legend(loc="best", frameon=True)
    by_time.set_xlabel("seconds since the first step")
    by_time.set_title("loss against time", fontsize=11)
    by_time.tick_params(labelleft=True)
    for axes in (by_step, by_time):
        axes.grid(True, which="major", linewidth=0.7, alpha=0.6)
        axes.grid(True, which="minor", axis="y", linewidth=0.4, alpha=0.3)
        axes.set_xlim(left=0)

    try:
        figure.savefig(options.out, dpi=DPI)
    except (OSError, ValueError) as error:
        fail(f"cannot write {options.out}: {getattr(error, 'strerror', None) or error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
