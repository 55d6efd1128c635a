"""Whether worker processes can be spawned from this process: a spawned
worker re-runs the main script, which must be a file whose engine start sits
under ``if __name__ == "__main__":``. Decided before a LocalCluster starts."""

from __future__ import annotations

import os
import sys
import warnings

import dask

from ...errors import ClusterError

GUARD = 'if __name__ == "__main__":'


def _spawn_problem() -> str | None:
    """Why worker processes cannot be spawned from this process, or None.

    A spawned worker process re-runs the main script (multiprocessing's
    ``spawn``/``forkserver``, distributed's default): a script read from
    standard input cannot be re-read, and a script whose top-level code starts
    the engine would start it again in every worker (which multiprocessing
    refuses: "Nanny failed to start"). ``python -c``, the REPL, notebooks and
    ``python -m package`` have nothing to re-run.
    """
    import multiprocessing

    if dask.config.get("distributed.worker.multiprocessing-method", "spawn") == "fork":
        return None
    main = sys.modules.get("__main__")
    if _bootstrapping():
        return (f"this is a worker process re-running the main script; the script starts an "
                f"engine outside the {GUARD!r} guard")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if name is not None:  # python -m module: re-imported by name, except a package's __main__
        if name == "__main__" or name.endswith(".__main__"):
            return None
        path = getattr(spec, "origin", None) or getattr(main, "__file__", None)
    else:
        path = getattr(main, "__file__", None)
        if path is None:
            return None
        if os.path.splitext(os.path.basename(path))[0] == "ipython":
            return None  # multiprocessing skips it too
        full = os.path.join(multiprocessing.process.ORIGINAL_DIR or "", path)
        if not os.path.isfile(full):
            return (f"the main script {path!r} is not a file (code read from standard input, "
                    "`python -`), so worker processes cannot re-run it")
    line = _unguarded_line(main, path)
    if line is None:
        return None
    return (f"{path} starts the engine from line {line}, outside an {GUARD!r} block, and every "
            "worker process re-runs the main script")


def _bootstrapping() -> bool:
    """True while a spawned child re-runs the main script (before its target runs)."""
    import multiprocessing

    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def _unguarded_line(main, path: str | None) -> int | None:
    """The line of the main script's top-level code that is (indirectly) starting
    the engine now, if it is not inside an ``if __name__ == "__main__":`` block."""
    import ast

    if path is None or main is None:
        return None
    try:
        target = os.path.realpath(path)
    except (TypeError, ValueError):
        return None
    frame, line = sys._getframe(1), None
    while frame is not None:
        code = frame.f_code
        if (frame.f_globals is main.__dict__ and code.co_name == "<module>"
                and os.path.realpath(code.co_filename) == target):
            line = frame.f_lineno
        frame = frame.f_back
    if line is None:
        return None
    try:
        with open(target, "rb") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.body and \
                node.body[0].lineno <= line <= (node.body[-1].end_lineno or line):
            return None
    return line


def _is_main_test(test) -> bool:
    import ast

    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1


def choose_processes(processes: bool | None, n: int) -> bool:
    """Worker processes unless the main script cannot be re-run by them: then
    in-process (thread) workers with a warning, or a ClusterError when
    ``processes=True`` was asked for. Decided before anything starts."""
    if processes is False:
        return False
    why = _spawn_problem()
    if why is None:
        return True
    guard = f"put the script's code in a file, under {GUARD!r}"
    if processes or _bootstrapping():
        raise ClusterError(f"cannot start worker processes: {why}; {guard}, or pass "
                           "processes=False for workers that are threads of this process")
    warnings.warn(
        f"tilearray: running {n} worker(s) as threads of this process, not as processes: "
        f"{why}. For worker processes {guard}; pass processes=False to silence this warning",
        RuntimeWarning, stacklevel=3)
    return False
