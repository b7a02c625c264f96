"""Input checks shared by the plot scripts: every input is a regular file below a size limit, of
the kind the script draws (the CSV's columns, a Chrome trace's events), with numbers where
numbers belong. A violation raises InputError; `run(main)` turns it into one line on stderr
naming the file, line and column, and exit code 2 (bad input), never a traceback.
"""
import csv
import io
import json
import math
import os
import stat
import sys

MAX_INPUT_BYTES = 64 << 20  # the limit of ptdp's text inputs (core/input_file.hpp)


class InputError(Exception):
    pass


def read_text(path, what):
    """The file's text; InputError when missing, not a regular file, too large or not UTF-8."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise InputError(f"{path}: {what}: {e.strerror}")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path}: {what} is not a regular file")
    if st.st_size > MAX_INPUT_BYTES:
        raise InputError(f"{path}: {what} is {st.st_size} bytes, above the limit of {MAX_INPUT_BYTES >> 20} MiB")
    with open(path, "rb") as f:
        data = f.read(MAX_INPUT_BYTES + 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: {what} is not text (byte {e.start} is not UTF-8)")


def read_csv(path, what, columns):
    """[(line number, row dict)] of a CSV with at least `columns` in its header."""
    text = read_text(path, what)
    try:
        reader = csv.DictReader(io.StringIO(text))
        header = reader.fieldnames or []
        missing = [c for c in columns if c not in header]
        if missing:
            raise InputError(f"{path}:1: not a {what}: no column {', '.join(missing)} "
                             f"(its header has: {', '.join(header) or 'nothing'})")
        return [(reader.line_num, row) for row in reader]
    except csv.Error as e:
        raise InputError(f"{path}: not a {what}: {e}")


def number(path, line, row, column, integer=False, positive=False):
    """The finite number in `column` of a CSV row; InputError naming file:line and the column."""
    text = row.get(column)
    try:
        v = int(text) if integer else float(text)
    except (TypeError, ValueError):
        raise InputError(f"{path}:{line}: column {column}: expected {'an integer' if integer else 'a number'} "
                         f"(got {text!r})")
    if not math.isfinite(v) or (positive and v <= 0):
        raise InputError(f"{path}:{line}: column {column}: expected a {'positive ' if positive else ''}finite number "
                         f"(got {text!r})")
    return v


def read_json(path, what):
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}:{e.colno}: not a {what}: {e.msg}")
    except RecursionError:
        raise InputError(f"{path}: not a {what}: nested too deeply")


def run(main, name):
    """Runs main(); bad input → 'NAME: error: …' on stderr and exit 2."""
    try:
        main()
    except InputError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except (KeyError, TypeError, ValueError, IndexError, RecursionError, OverflowError, ZeroDivisionError) as e:
        # Input the checks above did not foresee: still one line naming the input, never a traceback.
        files = [a for a in sys.argv[1:] if os.path.isfile(a)]
        print(f"{name}: error: malformed input ({', '.join(files) or 'arguments'}): {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
